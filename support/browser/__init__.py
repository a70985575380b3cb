"""The browser scenario's driver (:mod:`support.browser.harness`) and the page-side echo path it
installs (``echo_path.js``): shared by tests/browser and the browser scripts."""
