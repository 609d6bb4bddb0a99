"""The package's import structure, read from its source: the layers in order, no cycles, few lazy imports.

Data flows one way (workload -> load run -> measurements -> score/diagnosis -> next trial -> report), and
the imports follow it. `LAYERS` lists the package's parts bottom first; a part may import only the parts
listed before it, so each can be used, tested and replaced without the ones above it, and a cycle between
parts cannot exist (it would need an import upwards). Imports inside functions count the same as
top-level ones (a function-local import hides a cycle; it does not remove it), and outside the command
line there are at most `MAX_LOCAL` of them, each with its reason in `LOCAL_IMPORTS`.

The checker functions take the package's folder, so the tests at the end run them on a copy with one bad
import injected and show that each kind of mistake fails.
"""

from __future__ import annotations

import ast
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "tuner"

#: The package's parts, bottom first: a part may import only the parts before it. A part is a
#: sub-package or a top-level module of `tuner`.
LAYERS = [
    # vocabulary every layer speaks: errors, validation, the kinds of launch failure, signals, tokens
    "tuner.errors", "tuner.validation", "tuner.failures", "tuner.signals", "tuner.tokens",
    "tuner.yaml_strict", "tuner.inputs", "tuner.limits",
    # the host's devices as disjoint sets (what `--devices` means), then the run's settings, one model
    # validated once (engine, load, knee search, search, devices, outputs)
    "tuner.devices", "tuner.settings",
    # a configuration: the knobs (speculative decoding's config is one knob's value)
    "tuner.speculative", "tuner.knobs",
    # records: what a load run measured and what a study stores (the bottom every layer reads)
    "tuner.metrics", "tuner.storage",
    # inputs: hardware and model profiles, workloads
    "tuner.profiles", "tuner.workload", "tuner.lora",
    # the load run: the client records, the SLO scores its records, the bench statistics
    "tuner.replay", "tuner.slo", "tuner.bench",
    # quality: how far an output-changing configuration moved the answers (prompt logprobs over HTTP)
    "tuner.quality",
    # the simulated engine and what it bounds (floors, feasibility before a launch)
    "tuner.sim", "tuner.floors", "tuner.feasibility",
    # engines launch servers and serve load runs
    "tuner.engine",
    # measurement: a load run's verdict and the knee search; the diagnosis of a knee
    "tuner.capacity", "tuner.diagnose",
    # what the stored measurements say: the recommendation, the capacity plan, checks before a study
    "tuner.recommend", "tuner.plan", "tuner.preflight",
    # the twin: a simulator fitted to a study's launches
    "tuner.twin",
    # fleets: N simulated replicas behind the router's policies, proving the plan
    "tuner.fleet",
    # outputs and search over measurements
    "tuner.report", "tuner.gate", "tuner.search",
    # the study runner: wires search, gate and report
    "tuner.study",
    # the engine conformance suite and test stand-ins (a library for tests of every engine)
    "tuner.testing",
    # the command line, over everything
    "tuner.cli",
]

#: Imports inside functions outside the command line, each with the reason it is not at the top:
#: (importing module, imported module) -> why. The command line (`tuner.cli`) imports lazily as it
#: likes: it is the top, and `tune --help` should not load every library below it.
LOCAL_IMPORTS: dict[tuple[str, str], str] = {
    ("tuner.report", "tuner.report.plots"):
        "matplotlib (about a second to import) only when the plots are drawn: building a report, the gate "
        "and `tune plan` need none",
    ("tuner.testing.tiny_model", "tuner.workload.prompts"):
        "the module also runs as a script under vLLM's interpreter, which may lack the tuner's dependencies: "
        "the import is tried, and the built-in word list serves where it fails",
}
MAX_LOCAL = 10


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def part_of(module: str) -> str:
    """The layer a module belongs to. A `__main__` module (`python -m tuner.cli`) is a command line shim
    that only calls `tuner.cli`: it belongs to the command line, wherever `python -m` needs it to be."""
    if module.rpartition(".")[2] == "__main__":
        return "tuner.cli"
    return ".".join(module.split(".")[:2])


def _targets(node: ast.AST, name: str, is_pkg: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = name.split(".")
            base = base[: len(base) - node.level + (1 if is_pkg else 0)]
            mod = ".".join(base + ([node.module] if node.module else []))
        else:
            mod = node.module or ""
        return [mod] + [f"{mod}.{a.name}" for a in node.names]
    if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == \
            "import_module" and node.args and isinstance(node.args[0], ast.Constant):
        return [str(node.args[0].value)]
    return []


def read_imports(root: Path) -> tuple[dict[str, set[str]], set[tuple[str, str]]]:
    """module -> the project modules it imports (anywhere in the file), and the (module, imported)
    pairs imported inside a function."""
    mods = {module_name(p, root): p for p in root.rglob("*.py")}
    out: dict[str, set[str]] = {}
    local: set[tuple[str, str]] = set()
    for name, path in mods.items():
        found: set[str] = set()
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        in_function = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                       for n in ast.walk(f)}
        for node in ast.walk(tree):
            for t in _targets(node, name, is_pkg):
                # the longest project module the target names (`from tuner.x import y`: y may be a module)
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t not in ("", "tuner", name) and id(node) in in_function and \
                        isinstance(node, (ast.Import, ast.ImportFrom)):
                    local.add((name, t))
                # importing tuner.a.b runs tuner/a/__init__.py first: a package's face is imported too
                while t and t.startswith("tuner"):
                    if t != name and not name.startswith(t + "."):
                        found.add(t)
                    t = t.rpartition(".")[0]
        out[name] = found
    return out, local


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle in a directed graph, as the path that closes it, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def part_graph(imports: dict[str, set[str]]) -> dict[str, set[str]]:
    """part -> the other parts its modules import (`tuner` itself, the package's face, is no part)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for m, deps in imports.items():
        if m == "tuner":
            continue
        for n in deps:
            if n != "tuner" and part_of(n) != part_of(m):
                graph[part_of(m)].add(part_of(n))
    return graph


def layer_violations(imports: dict[str, set[str]], layers: list[str] = LAYERS) -> list[str]:
    """Every import of a part at or above the importer's own place in `layers`, and every part
    `layers` does not place."""
    rank = {p: i for i, p in enumerate(layers)}
    bad = sorted({f"{part_of(m)} is not in LAYERS" for m in imports if m != "tuner" and part_of(m) not in rank})
    for m, deps in sorted(imports.items()):
        if m == "tuner" or part_of(m) not in rank:
            continue
        for n in sorted(deps):
            if n != "tuner" and part_of(n) != part_of(m) and rank.get(part_of(n), len(layers)) > rank[part_of(m)]:
                bad.append(f"{m} imports {n} ({part_of(n)} is above {part_of(m)})")
    return bad


def main_shim_violations(imports: dict[str, set[str]]) -> list[str]:
    """A `__main__` outside the command line package is a shim for `python -m`: it imports the command
    line and nothing else (its code lives in `tuner.cli`)."""
    return sorted(f"{m} imports {n}" for m, deps in imports.items()
                  if m.endswith(".__main__") and part_of(m.removesuffix(".__main__")) != "tuner.cli"
                  for n in deps if part_of(n) != "tuner.cli" and n != "tuner")


def unexplained_local_imports(local: set[tuple[str, str]],
                              reasons: dict[tuple[str, str], str] = LOCAL_IMPORTS) -> list[str]:
    """Function-local project imports outside the command line without a reason in `LOCAL_IMPORTS`."""
    return sorted(f"{m} imports {n} inside a function" for m, n in local
                  if part_of(m) != "tuner.cli" and (m, n) not in reasons)


IMPORTS, LOCAL = read_imports(PKG)


def test_the_parts_are_in_layers() -> None:
    bad = layer_violations(IMPORTS)
    assert not bad, "a part imports one above it (see LAYERS): " + "; ".join(bad)


def test_no_part_cycles() -> None:
    cycle = find_cycle(part_graph(IMPORTS))
    assert cycle is None, "package cycle: " + " -> ".join(cycle)


def test_no_module_cycles() -> None:
    cycle = find_cycle(IMPORTS)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_main_shims_only_call_the_command_line() -> None:
    bad = main_shim_violations(IMPORTS)
    assert not bad, "a __main__ does more than call tuner.cli: " + "; ".join(bad)


def test_every_command_line_module_is_in_the_cli_package() -> None:
    """One place for the command line: no `cli.py` / `*_cli.py` / typer app elsewhere."""
    bad = sorted(str(p.relative_to(PKG.parent)) for p in PKG.rglob("*.py")
                 if part_of(module_name(p, PKG)) != "tuner.cli"
                 and (p.stem == "cli" or p.stem.endswith("_cli") or "typer.Typer(" in p.read_text()))
    assert not bad, "command line modules outside tuner/cli: " + ", ".join(bad)


def test_function_local_imports_have_a_reason() -> None:
    bad = unexplained_local_imports(LOCAL)
    assert not bad, "move these to the top of the module, or state why not in LOCAL_IMPORTS: " + "; ".join(bad)
    stale = sorted(f"{m} -> {n}" for m, n in LOCAL_IMPORTS if (m, n) not in LOCAL)
    assert not stale, "LOCAL_IMPORTS names imports that are gone: " + "; ".join(stale)
    assert len(LOCAL_IMPORTS) <= MAX_LOCAL and all(LOCAL_IMPORTS.values())


def test_the_reader_sees_function_local_imports() -> None:
    """The rules above are only as good as the reader: it finds an import inside a function."""
    assert ("tuner.cli", "tuner.cli.study") in LOCAL and "tuner.cli.study" in IMPORTS["tuner.cli"]


# -- each kind of mistake fails: the checkers run on a copy of the package with one bad import added --

def _tree_with(tmp_path: Path, file: str, code: str) -> Path:
    root = tmp_path / "tuner"
    shutil.copytree(PKG, root, ignore=shutil.ignore_patterns("__pycache__"))
    path = root / file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((path.read_text() if path.exists() else "") + "\n" + code + "\n")
    return root


def test_a_new_package_cycle_fails(tmp_path: Path) -> None:
    imports, _ = read_imports(_tree_with(tmp_path, "metrics/window.py", "from tuner.replay.record import LoadRun"))
    assert find_cycle(part_graph(imports)) is not None
    assert any("tuner.metrics.window imports tuner.replay.record" in v for v in layer_violations(imports))


def test_sim_importing_search_fails(tmp_path: Path) -> None:
    imports, _ = read_imports(_tree_with(tmp_path, "sim/engine.py", "from tuner.search import space"))
    assert any(v.startswith("tuner.sim.engine imports tuner.search") for v in layer_violations(imports))


def test_profiles_importing_engine_fails(tmp_path: Path) -> None:
    imports, _ = read_imports(_tree_with(tmp_path, "profiles/gpus.py",
                                         "def f():\n    from tuner.engine import registry"))
    assert any(v.startswith("tuner.profiles.gpus imports tuner.engine") for v in layer_violations(imports))


def test_a_command_line_module_below_the_cli_gets_its_layers_rules(tmp_path: Path) -> None:
    """The old deny-list exempted every `*cli` module; now a command line module outside `tuner/cli` is
    judged by its package's place (and named as misplaced)."""
    root = _tree_with(tmp_path, "sim/cli.py", "import typer\nfrom tuner.search.space import load_space")
    imports, _ = read_imports(root)
    assert "tuner.sim.cli imports tuner.search.space (tuner.search is above tuner.sim)" in layer_violations(imports)


def test_a_main_shim_doing_more_fails(tmp_path: Path) -> None:
    imports, _ = read_imports(_tree_with(tmp_path, "sim/__main__.py", "from tuner.sim.server import run_server"))
    assert main_shim_violations(imports) == ["tuner.sim.__main__ imports tuner.sim.server"]


def test_a_new_function_local_import_fails(tmp_path: Path) -> None:
    _, local = read_imports(_tree_with(tmp_path, "tokens.py", "def f():\n    from tuner.errors import UserError"))
    assert "tuner.tokens imports tuner.errors inside a function" in unexplained_local_imports(local)
    assert "tuner.tokens imports tuner.errors inside a function" not in unexplained_local_imports(LOCAL)


def test_an_unplaced_package_fails(tmp_path: Path) -> None:
    imports, _ = read_imports(_tree_with(tmp_path, "newpart/__init__.py", "from tuner.errors import UserError"))
    assert "tuner.newpart is not in LAYERS" in layer_violations(imports)


@pytest.mark.parametrize("part", LAYERS)
def test_every_layer_exists(part: str) -> None:
    assert any(part_of(m) == part for m in IMPORTS), f"{part} is in LAYERS but not in the package"


def test_no_private_name_is_imported_from_another_module() -> None:
    """A name with a leading underscore is its module's own: another module that needs it needs a public
    name (guided read three private helpers of `tuner.search.strategy`)."""
    import ast

    found = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tuner"):
                found += [f"{path.relative_to(PKG)}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, found


def test_no_function_is_over_80_lines() -> None:
    """Issue 62: a function that does one thing reads in one screen; a longer one is split where it reads
    better (its phases as functions of their own)."""
    import ast

    long = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > 80:
                    long.append(f"{path.relative_to(PKG)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long
