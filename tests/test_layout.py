"""The layout's import rules (ARCHITECTURE.md), checked on the source so a crossing fails here.

* ``tts_service`` (the server) never imports the agent side, the apps or a voice framework;
* ``agent`` uses the server package only through its client-facing modules, and Pipecat or
  LiveKit only inside their own plug-in modules;
* nothing imports ``pipelines`` (apps are not libraries), and its modules do not import each
  other in a circle;
* ``examples`` use the public API only;
* the engine-independent core (``tts_service.core``) imports no engine package, and no engine
  package imports another (a third engine goes beside them and meets only the core).

Imports inside functions count too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = ("pipecat", "livekit")
# what the agent side may use of the server package: the wire format, the client and its
# session, and the helpers that start a local server
AGENT_MAY_USE = ("tts_service.protocol", "tts_service.client", "tts_service.session", "tts_service.localproc")
ENGINES = ("tts_service.piper", "tts_service.orpheus")  # engine packages beside tts_service/core
PUBLIC_API = ("tts_service.client", "tts_service.protocol", "agent.pipecat", "agent.livekit", "agent.webrtc_uplink")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, module: str | None = None) -> list[tuple[int, str]]:
    """Every module this file imports, absolute, with its line (relative imports resolved
    against ``module``, by default the file's own module name)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = (module or _module_name(path)).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            found.append((node.lineno, mod))
            # ``from pkg import module`` imports pkg.module
            found += [(node.lineno, f"{mod}.{alias.name}") for alias in node.names if alias.name != "*"]
    return found


def _files(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _is(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


def _violations(folder: str, rule) -> list[str]:
    out = []
    for path in _files(folder):
        for line, mod in _imports(path):
            why = rule(path, mod)
            if why:
                out.append(f"{path.relative_to(ROOT)}:{line} imports {mod}: {why}")
    return out


def _server_rule(path: Path, mod: str) -> str | None:
    for banned in ("agent", "pipelines", *FRAMEWORKS):
        if _is(mod, banned):
            return "the server package never imports the agent side, the apps or a voice framework"
    return None


def _agent_rule(path: Path, mod: str) -> str | None:
    if _is(mod, "pipelines"):
        return "nothing imports pipelines (apps are not libraries)"
    if _is(mod, "tts_service") and mod != "tts_service" and not any(_is(mod, ok) for ok in AGENT_MAY_USE):
        return f"the agent side uses only {', '.join(AGENT_MAY_USE)} of the server package"
    for fw in FRAMEWORKS:
        if _is(mod, fw) and not path.stem.startswith(fw):
            return f"{fw} may be imported only in its plug-in module (agent/{fw}*.py)"
    return None


def _pipelines_rule(path: Path, mod: str) -> str | None:
    for fw in FRAMEWORKS:
        if _is(mod, fw) and not path.stem.startswith(fw):
            return f"{fw} may be imported only in the {fw} app modules (pipelines/{fw}_*.py)"
    return None


def _examples_rule(path: Path, mod: str) -> str | None:
    ours = ("tts_service", "agent", "pipelines")
    if any(_is(mod, p) for p in ours) and not any(_is(mod, ok) for ok in PUBLIC_API) and mod not in ours:
        return f"examples use the public API only ({', '.join(PUBLIC_API)})"
    return None


@pytest.mark.parametrize(
    ("folder", "rule"),
    [
        ("tts_service", _server_rule),
        ("agent", _agent_rule),
        ("pipelines", _pipelines_rule),
        ("examples", _examples_rule),
    ],
)
def test_imports_follow_the_layout(folder, rule):
    assert _violations(folder, rule) == []


def _engine_rule(path: Path, mod: str) -> str | None:
    """Inside ``tts_service``: the core sees no engine, an engine sees no other engine."""
    own = _module_name(path)
    if _is(own, "tts_service.core"):
        if any(_is(mod, e) for e in ENGINES):
            return "the core is engine-independent: it never imports an engine package"
    else:
        for engine in ENGINES:
            if _is(own, engine) and any(_is(mod, e) for e in ENGINES if e != engine):
                return "an engine package never imports another engine (shared code goes in tts_service.core)"
    return None


def test_core_and_engines_are_separate_packages():
    assert (ROOT / "tts_service" / "core" / "__init__.py").exists()
    assert all((ROOT / Path(*e.split(".")) / "__init__.py").exists() for e in ENGINES)
    assert _violations("tts_service", _engine_rule) == []


def test_nothing_outside_pipelines_imports_it():
    bad = []
    for folder in ("tts_service", "agent", "examples"):
        bad += [v for v in _violations(folder, lambda p, m: "imports an app" if _is(m, "pipelines") else None)]
    assert bad == []


def test_pipelines_modules_do_not_import_each_other_in_a_circle():
    graph: dict[str, set[str]] = {}
    for path in _files("pipelines"):
        name = _module_name(path)
        graph[name] = {m for _, m in _imports(path) if _is(m, "pipelines") and m != name and m in _all_modules()}

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        while stack:
            node, trail = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return [*trail, nxt]
                if nxt not in trail:
                    stack.append((nxt, [*trail, nxt]))
        return None

    cycles = [c for c in (cycle_from(m) for m in graph) if c]
    assert cycles == [], f"import cycles: {[' -> '.join(c) for c in cycles]}"


def _all_modules() -> set[str]:
    return {_module_name(p) for p in _files("pipelines")}


def test_the_checker_sees_a_crossing(tmp_path):
    """The rules are live: a crossing is reported, lazy imports included, and relative imports are
    resolved (``from ..protocol`` inside ``tts_service.sub`` is the server's own module)."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import pipecat.frames\nfrom ..protocol import MsgType\n\ndef f():\n    from agent import bargein\n",
        encoding="utf-8",
    )
    mods = [m for _, m in _imports(probe, module="tts_service.sub.probe")]
    assert "tts_service.protocol" in mods
    assert [m for m in mods if _server_rule(probe, m)] == ["pipecat.frames", "agent", "agent.bargein"]
    # an engine crossing inside the server package is reported too
    core_probe = ROOT / "tts_service" / "core" / "probe.py"
    assert _engine_rule(core_probe, "tts_service.piper.engine")
    assert _engine_rule(ROOT / "tts_service" / "orpheus" / "probe.py", "tts_service.piper.scheduler")
    assert _engine_rule(ROOT / "tts_service" / "orpheus" / "probe.py", "tts_service.core.scheduler") is None
