"""The layout's import rules (ARCHITECTURE.md), checked on the source so a crossing fails here.

* ``tts_service`` (the server) never imports the agent side, the apps or a voice framework;
* ``agent`` uses the server package only through its client-facing modules, and Pipecat or
  LiveKit only inside their own plug-in modules;
* nothing imports ``pipelines`` (apps are not libraries);
* no import circles anywhere in the project (every folder with Python in it but tests/);
* nothing outside ``tests/`` imports ``tests/`` or puts it on ``sys.path`` (shared helpers live in
  ``support/``), and the product (``tts_service``, ``agent``, ``pipelines``) imports no tool
  (``bench``, ``scripts``, ``support``);
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
# what the agent side may use of the server package: the wire format, the client, its driver and
# session, the helpers that start a local server, and the stdlib-only bounded waits every loop
# shares (tts_service.aio: one fix for 3.11's wait_for, not one per side)
AGENT_MAY_USE = (
    "tts_service.protocol",
    "tts_service.aio",
    "tts_service.client",
    "tts_service.driver",
    "tts_service.session",
    "tts_service.localproc",
)
ENGINES = ("tts_service.piper", "tts_service.orpheus")  # engine packages beside tts_service/core
PUBLIC_API = (
    "tts_service.client",
    "tts_service.protocol",
    "agent.pipecat",
    "agent.livekit",
    "agent.webrtc_uplink",
    "agent.runtime",
)
# agent/ has two halves: the plug-ins (agent/*.py) and the framework-free runtime (agent/runtime/);
# the runtime's old addresses stay as pure re-exports, and the simulation is a tool beside them (sim/)
RUNTIME = "agent.runtime"
AGENT_COMPAT = ("agent.vad", "agent.jitter", "agent.speech", "agent.bargein", "agent.echo")
PLUGIN_ONLY = (*FRAMEWORKS, "aiortc")  # the stacks a plug-in adapts; the runtime imports none of them


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
    if _is(mod, "sim"):
        return "the agent side never imports the simulation (a tool)"
    for fw in FRAMEWORKS:
        if _is(mod, fw) and not (path.stem.startswith(fw) and path.parent == ROOT / "agent"):
            return f"{fw} may be imported only in its plug-in module (agent/{fw}*.py)"
    return None


def _runtime_rule(path: Path, mod: str) -> str | None:
    """Inside ``agent.runtime``: no framework, no plug-in, nothing of the old addresses."""
    if any(_is(mod, fw) for fw in PLUGIN_ONLY):
        return "the agent's runtime is framework-free (plug-ins adapt it to pipecat, livekit, aiortc)"
    if _is(mod, "agent") and mod != "agent" and not _is(mod, RUNTIME):
        return "the runtime never imports a plug-in (or a compat address): plug-ins use the runtime"
    return _agent_rule(path, mod)


def _sim_rule(path: Path, mod: str) -> str | None:
    """The simulation drives the runtime as an agent would, without a framework or a plug-in."""
    if _is(mod, "agent") and mod != "agent" and not _is(mod, RUNTIME):
        return "the simulation drives agent.runtime only (no plug-in, no compat address)"
    if any(_is(mod, fw) for fw in PLUGIN_ONLY) or _is(mod, "pipelines"):
        return "the simulation needs no framework and no app"
    if _is(mod, "tts_service") and mod != "tts_service" and not any(_is(mod, ok) for ok in AGENT_MAY_USE):
        return f"the simulation uses only {', '.join(AGENT_MAY_USE)} of the server package"
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


# The modules that carry streams or start servers; with the core, none may know an engine.
TRANSPORTS_AND_LAUNCHERS = (
    "tts_service.server",
    "tts_service.ws",
    "tts_service.cli",
    "tts_service.localproc",
    "tts_service.demo",
    "tts_service.replicas",
    "tts_service.haproxy_agent",
    "tts_service.core",
)
REGISTRY = "tts_service.engines"  # names the engines by module path (strings), imports none


def _engine_blind_rule(path: Path, mod: str) -> str | None:
    """Outside the engine packages nothing in ``tts_service`` imports one, lazily or not: the
    server, the CLI and the launchers get their engine from the registry, by name."""
    own = _module_name(path)
    if any(_is(own, e) for e in ENGINES) or not any(_is(mod, e) for e in ENGINES):
        return None
    if own == REGISTRY:
        return "the registry names engines by module path (a string); it imports none"
    if any(_is(own, t) for t in TRANSPORTS_AND_LAUNCHERS):
        return "a transport, launcher or the core never imports an engine package: ask tts_service.engines"
    return "only an engine package imports an engine package: the rest asks tts_service.engines"


def _direction_rule(path: Path, mod: str) -> str | None:
    """One import direction in every engine: the scheduler plans (and defines what it exchanges
    with the engine), the engine imports the scheduler, the runtime imports both."""
    own = _module_name(path)
    for e in ENGINES:
        if own == f"{e}.scheduler" and any(_is(mod, f"{e}.{m}") for m in ("engine", "runtime", "serve")):
            return "an engine's scheduler never imports its engine or runtime (the engine imports the scheduler)"
        if own == f"{e}.engine" and any(_is(mod, f"{e}.{m}") for m in ("runtime", "serve")):
            return "an engine never imports its runtime (the runtime imports the engine)"
    return None


def test_transports_launchers_and_the_core_import_no_engine():
    assert _violations("tts_service", _engine_blind_rule) == []
    # the registry's built-in entries are the engine packages this file knows
    from tts_service import engines

    built_in = {engines.entry(n).__name__.rsplit(".", 1)[0] for n in ("piper", "orpheus")}
    assert built_in == set(ENGINES)
    missing = [t for t in TRANSPORTS_AND_LAUNCHERS if not _exists(t)]
    assert missing == [], "a module the rule names is gone: update TRANSPORTS_AND_LAUNCHERS"


def _exists(module: str) -> bool:
    path = ROOT / Path(*module.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def test_every_engine_imports_in_one_direction():
    assert _violations("tts_service", _direction_rule) == []


def test_nothing_outside_pipelines_imports_it():
    bad = []
    for folder in ("tts_service", "agent", "examples"):
        bad += [v for v in _violations(folder, lambda p, m: "imports an app" if _is(m, "pipelines") else None)]
    assert bad == []


# Every folder of the repository with Python in it except tests/: the product, the tools (bench,
# the simulation), the support package, scripts and examples. Found rather than listed, so a new
# package is covered the day it appears.
def _project_folders() -> list[str]:
    return sorted(
        d.name
        for d in ROOT.iterdir()
        if d.is_dir()
        and not d.name.startswith(".")
        and d.name != "tests"
        and not d.name.endswith(".egg-info")
        and _files(d.name)
    )


def _project_modules() -> dict[str, Path]:
    return {_module_name(p): p for folder in _project_folders() for p in _files(folder)}


def _import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``modules`` it imports, lazy imports included. An import names the
    longest module it reaches (``from pkg import name``: ``pkg.name`` when that is a module, else
    ``pkg``). A module's own packages are left out: Python imports them before the module anyway,
    so ``from . import sibling`` is no circle."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for _, mod in _imports(path, module=name):
            parts = mod.split(".")
            hit = next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in modules), None)
            if hit is not None and hit != name and not _is(name, hit):
                targets.add(hit)
        graph[name] = targets
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle (``[a, b, ..., a]``) per strongly connected group of modules (Tarjan's algorithm),
    so each tangle is reported once however many ways round it there are."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_a_way_round(graph, group) for group in groups]


def _a_way_round(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """The shortest circle through the group's first module (breadth first, inside the group)."""
    start = min(group)
    trails = [[start]]
    seen = {start}
    while trails:
        trail = trails.pop(0)
        for nxt in sorted(graph[trail[-1]] & group):
            if nxt == start:
                return [*trail, start]
            if nxt not in seen:
                seen.add(nxt)
                trails.append([*trail, nxt])
    raise AssertionError(f"no circle in {group}")  # a strongly connected group always has one


def test_no_import_circles_anywhere():
    assert {"tts_service", "agent", "pipelines", "bench", "support", "scripts", "examples"} <= set(_project_folders())
    circles = _circles(_import_graph(_project_modules()))
    assert circles == [], f"import circles: {[' -> '.join(c) for c in circles]}"


def _tests_rule(path: Path, mod: str) -> str | None:
    if _is(mod, "tests"):
        return "nothing outside tests/ imports tests/: a helper both need goes in support/"
    return None


def _names_tests(node: ast.AST) -> bool:
    """A string with ``tests`` as one of its path parts (``"tests"``, ``"tests/agent"``, ``"/x/tests"``)."""
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and "tests" in node.value.split("/")


def _tests_on_sys_path(path: Path) -> list[int]:
    """Lines that put tests/ (or a folder in it) on ``sys.path``: a bare-name import from there
    (``from test_jitter import simulate``) is an import of tests/ by another name."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    lines = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("insert", "append", "extend")
            and ast.unparse(node.func.value) == "sys.path"
            and any(_names_tests(c) for arg in node.args for c in ast.walk(arg))
        ):
            lines.append(node.lineno)
    return lines


def _reaches_into_tests(folder: str) -> list[str]:
    bad = _violations(folder, _tests_rule)
    for path in _files(folder):
        bad += [f"{path.relative_to(ROOT)}:{n} puts tests/ on sys.path" for n in _tests_on_sys_path(path)]
    return bad


def test_nothing_outside_tests_imports_tests():
    bad = []
    for folder in _project_folders():
        bad += _reaches_into_tests(folder)
    assert bad == []


PRODUCT = ("tts_service", "agent", "pipelines")
TOOLS = ("bench", "scripts", "support", "tests")  # drive the product from outside; it knows none of them


def _product_rule(path: Path, mod: str) -> str | None:
    for tool in TOOLS:
        if _is(mod, tool):
            return f"the product never imports {tool}: the tools drive it from outside"
    return None


def test_the_product_imports_no_tool():
    bad = []
    for folder in PRODUCT:
        bad += _violations(folder, _product_rule)
    assert bad == []


def test_the_circle_and_tests_checkers_see_a_crossing(tmp_path):
    """The project-wide rules are live: a planted circle is found (one of them lazy, relative
    imports resolved), a module's import of its own package is none, and a reach into tests/ by
    import or by ``sys.path`` is reported; so is the product importing a tool."""
    old_cli = tmp_path / "cli.py"  # the circle this project had: the CLI and the bench's CLI
    old_cli.write_text("def build_parser():\n    from .bench.cli import add_bench_parser\n", encoding="utf-8")
    old_bench_cli = tmp_path / "bench_cli.py"
    old_bench_cli.write_text("from ..protocol import WS_PATH\n\ndef _levels():\n    from ..cli import CliError\n")
    modules = {**_project_modules(), "tts_service.cli": old_cli, "tts_service.bench.cli": old_bench_cli}
    assert _circles(_import_graph(modules)) == [["tts_service.bench.cli", "tts_service.cli", "tts_service.bench.cli"]]
    # relative: a module and its sibling, one lazily; their package's __init__ importing them is no circle
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import f\n", encoding="utf-8")
    (pkg / "a.py").write_text("from . import b\n\ndef f():\n    pass\n", encoding="utf-8")
    (pkg / "b.py").write_text("def g():\n    from .a import f\n", encoding="utf-8")
    planted = {"probe.pkg": pkg / "__init__.py", "probe.pkg.a": pkg / "a.py", "probe.pkg.b": pkg / "b.py"}
    assert _circles(_import_graph(planted)) == [["probe.pkg.a", "probe.pkg.b", "probe.pkg.a"]]
    (pkg / "b.py").write_text("def g():\n    from . import c\n", encoding="utf-8")
    assert _circles(_import_graph(planted)) == []
    # tests/ reached from outside: by import (lazily too) or by putting it on sys.path
    script = tmp_path / "script.py"
    script.write_text(
        "import sys\nfrom pathlib import Path\n"
        'sys.path.insert(0, str(Path(__file__).parent.parent / "tests" / "agent"))\n'
        'sys.path.append("support")\n'
        "def f():\n    from tests.tts_service import tts_helpers\n",
        encoding="utf-8",
    )
    assert [m for _, m in _imports(script, module="scripts.script") if _tests_rule(script, m)] == [
        "tests.tts_service",
        "tests.tts_service.tts_helpers",
    ]
    assert _tests_on_sys_path(script) == [3]
    assert _tests_rule(script, "support.tts_helpers") is None
    # the product reaching for a tool
    assert _product_rule(ROOT / "tts_service" / "cli.py", "bench.cli")
    assert _product_rule(ROOT / "pipelines" / "probe.py", "support.callers")
    assert _product_rule(ROOT / "agent" / "probe.py", "scripts.browser_scenario")
    assert _product_rule(ROOT / "tts_service" / "orpheus" / "probe.py", "tts_service.orpheus.bench") is None


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
    # a transport or launcher importing an engine is reported, lazily too; a module path in a
    # string (the registry's way) is no import
    lazy = tmp_path / "lazy.py"
    lazy.write_text(
        'ENTRY = "tts_service.piper.serve"\n\ndef f():\n    from .piper.runtime import PiperSynthesizer\n',
        encoding="utf-8",
    )
    for module in ("tts_service.server", "tts_service.localproc", "tts_service.engines"):
        found = [m for _, m in _imports(lazy, module=module)]
        assert found == ["tts_service.piper.runtime", "tts_service.piper.runtime.PiperSynthesizer"]
        probe_path = ROOT / Path(*module.split(".")).with_suffix(".py")
        assert all(_engine_blind_rule(probe_path, m) for m in found)
    assert _engine_blind_rule(ROOT / "tts_service" / "core" / "probe.py", "tts_service.orpheus")
    assert _engine_blind_rule(ROOT / "tts_service" / "piper" / "serve.py", "tts_service.piper.runtime") is None
    assert _engine_blind_rule(ROOT / "tts_service" / "cli.py", "tts_service.engines") is None
    # and an engine whose scheduler imports its engine module
    assert _direction_rule(ROOT / "tts_service" / "piper" / "scheduler.py", "tts_service.piper.engine")
    assert _direction_rule(ROOT / "tts_service" / "orpheus" / "engine.py", "tts_service.orpheus.runtime")
    assert _direction_rule(ROOT / "tts_service" / "orpheus" / "engine.py", "tts_service.orpheus.scheduler") is None


def test_agent_runtime_imports_no_framework_and_no_plugin():
    assert (ROOT / "agent" / "runtime" / "__init__.py").exists()
    assert _violations("agent/runtime", _runtime_rule) == []


def test_the_simulation_drives_only_the_runtime_and_nothing_in_the_product_imports_it():
    assert _violations("sim", _sim_rule) == []
    bad = []
    for folder in ("tts_service", "agent", "pipelines"):
        bad += _violations(folder, lambda p, m: "imports the simulation (a tool)" if _is(m, "sim") else None)
    assert bad == []


def _all_names(tree: ast.Module) -> list[str]:
    return next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
    )


def test_the_runtime_old_addresses_only_re_export_it():
    """``agent.vad`` & co. stay for users' code: each is a docstring, one import from its
    ``agent.runtime`` module covering that module's ``__all__``, and ``__all__``; nothing in the
    repository uses them (new code names the runtime)."""
    for name in AGENT_COMPAT:
        tree = ast.parse((ROOT / Path(*name.split("."))).with_suffix(".py").read_text(encoding="utf-8"))
        assert [type(n).__name__ for n in tree.body] == ["Expr", "ImportFrom", "Assign"], name
        target = RUNTIME + name.removeprefix("agent")
        assert tree.body[1].module == target, name
        exported = _all_names(tree)
        assert sorted(a.name for a in tree.body[1].names) == sorted(exported), name
        runtime_tree = ast.parse((ROOT / Path(*target.split("."))).with_suffix(".py").read_text(encoding="utf-8"))
        assert set(_all_names(runtime_tree)) <= set(exported), name
    users = []
    for folder in ("tts_service", "agent", "pipelines", "sim", "scripts", "support", "examples", "tests"):
        if (ROOT / folder).is_dir():
            users += _violations(folder, _old_address)
    assert users == []


def _old_address(path: Path, mod: str) -> str | None:
    if any(_is(mod, old) for old in AGENT_COMPAT):
        return "an old address of the runtime: import from agent.runtime"
    return None


def test_the_agent_rules_see_a_crossing():
    runtime = ROOT / "agent" / "runtime" / "probe.py"
    assert _runtime_rule(runtime, "pipecat.frames.frames")
    assert _runtime_rule(runtime, "aiortc.rtp")
    assert _runtime_rule(runtime, "agent.pipecat_yield")
    assert _runtime_rule(runtime, "agent.vad")
    assert _runtime_rule(runtime, "sim.sounds")
    assert _runtime_rule(runtime, "agent.runtime.jitter") is None
    # a framework only in a plug-in module beside the runtime, never inside it whatever its name
    assert _agent_rule(ROOT / "agent" / "runtime" / "livekit_probe.py", "livekit.rtc")
    assert _agent_rule(ROOT / "agent" / "livekit_probe.py", "livekit.rtc") is None
    assert _agent_rule(ROOT / "agent" / "pipecat_probe.py", "sim.barge_in")
    sim = ROOT / "sim" / "probe.py"
    assert _sim_rule(sim, "agent.pipecat")
    assert _sim_rule(sim, "agent.bargein")
    assert _sim_rule(sim, "livekit.agents")
    assert _sim_rule(sim, "tts_service.server")
    assert _sim_rule(sim, "agent.runtime.bargein") is None
