"""The package's import structure, read from its source: no import cycles, and the layers' rules.

Data flows one way (workload -> load run -> measurements -> score/diagnosis -> next trial -> report), and
the imports follow it: a lower layer never imports a higher one, so each can be used, tested and replaced
without the ones above it. Imports inside functions count the same as top-level ones (a function-local
import hides a cycle; it does not remove it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "tuner"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports() -> dict[str, set[str]]:
    """module -> the project modules it imports (anywhere in the file)."""
    mods = {_module_name(p): p for p in PKG.rglob("*.py")}
    out: dict[str, set[str]] = {}
    for name, path in mods.items():
        found: set[str] = set()
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".")
                    base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == \
                    "import_module" and node.args and isinstance(node.args[0], ast.Constant):
                targets = [str(node.args[0].value)]
            for t in targets:
                # the longest project module the target names (`from tuner.x import y`: y may be a module)
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                # importing tuner.a.b runs tuner/a/__init__.py first: a package's face is imported too
                while t and t.startswith("tuner"):
                    if t != name and not name.startswith(t + "."):
                        found.add(t)
                    t = t.rpartition(".")[0]
        out[name] = found
    return out


IMPORTS = _imports()


def _cycle() -> list[str] | None:
    """One import cycle among the package's modules (a package's `__init__` counts as its module)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(IMPORTS.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(IMPORTS):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_cycles() -> None:
    cycle = _cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _is_cli(module: str) -> bool:
    """A command line module: the top of the tool, over every layer (thin: parse options, call one entry
    point). The rules below are for everything else."""
    return _under(module, "tuner.cli") or module.rpartition(".")[2] == "__main__"


#: (layer, what it must never import, why)
RULES = [
    ("tuner.sim", ["tuner.search", "tuner.capacity", "tuner.replay", "tuner.report", "tuner.gate", "tuner.plan",
                   "tuner.study", "tuner.engine", "tuner.workload", "tuner.diagnose"],
     "the simulator knows nothing of HTTP clients, search or reports"),
    ("tuner.replay", ["tuner.search", "tuner.capacity", "tuner.report", "tuner.gate", "tuner.study",
                      "tuner.sim"], "the load generator knows nothing of the strategy"),
    ("tuner.metrics", ["tuner.search", "tuner.capacity", "tuner.report", "tuner.gate", "tuner.study",
                       "tuner.sim"], "metric reading knows nothing of the strategy"),
    ("tuner.workload", ["tuner.sim", "tuner.engine", "tuner.search", "tuner.capacity", "tuner.report",
                        "tuner.gate", "tuner.study"], "a workload is data, whatever engine replays it"),
    ("tuner.report", ["tuner.engine", "tuner.search", "tuner.study", "tuner.gate", "tuner.sim", "tuner.twin"],
     "reports read the study storage alone"),
    ("tuner.capacity", ["tuner.search", "tuner.report", "tuner.gate", "tuner.study"],
     "measurement knows nothing of the strategy"),
    ("tuner.storage", ["tuner.search", "tuner.capacity", "tuner.engine", "tuner.report", "tuner.gate",
                       "tuner.study", "tuner.plan", "tuner.sim", "tuner.replay", "tuner.twin"],
     "the storage contract is the bottom every layer reads"),
    ("tuner.engine", ["tuner.search", "tuner.capacity", "tuner.report", "tuner.gate", "tuner.study",
                      "tuner.plan"], "an engine launches servers and serves load runs, nothing more"),
    ("tuner.gate", ["tuner.search", "tuner.study", "tuner.report"],
     "the gate re-measures one configuration with the capacity layer; it runs no search"),
    ("tuner.plan", ["tuner.search", "tuner.study", "tuner.report", "tuner.engine", "tuner.gate"],
     "the plan is arithmetic over stored measurements"),
    ("tuner.diagnose", ["tuner.search", "tuner.study", "tuner.report", "tuner.gate", "tuner.engine"],
     "a diagnosis reads a load run's measurements"),
    ("tuner.replay", ["tuner.slo", "tuner.bench"], "the load client records; scoring against an SLO is above it"),
    ("tuner.search", ["tuner.study"], "the study runner is above the search"),
    ("tuner.twin", ["tuner.search", "tuner.study", "tuner.report", "tuner.gate"],
     "the twin is a simulator fitted to measurements; it knows nothing of the strategy that asks it"),
    ("tuner.slo", ["tuner.workload", "tuner.search", "tuner.capacity", "tuner.report", "tuner.sim"],
     "the SLO is a bottom-layer schema"),
]


@pytest.mark.parametrize("layer,forbidden,why", RULES, ids=[r[0] for r in RULES])
def test_layer_rules(layer: str, forbidden: list[str], why: str) -> None:
    bad = sorted(f"{m} -> {n}" for m, deps in IMPORTS.items() if _under(m, layer) and not _is_cli(m)
                 for n in deps if any(_under(n, f) for f in forbidden))
    assert not bad, f"{why}: " + "; ".join(bad)


def test_nothing_below_the_top_imports_the_study_runner() -> None:
    """Only the command line imports the module that runs a study (the search, the gate, the report and
    the plan are below it)."""
    bad = sorted(m for m, deps in IMPORTS.items() if "tuner.study" in deps and not _is_cli(m))
    assert not bad, "imports the study runner: " + ", ".join(bad)


def test_the_reader_sees_function_local_imports() -> None:
    """The rules above are only as good as the reader: it finds an import inside a function."""
    assert "tuner.errors" in IMPORTS["tuner.cli"]
