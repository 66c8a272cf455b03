"""Package layout rules: no import cycles in vlastack/ or among bench/'s scripts (counting lazy,
in-function and ``TYPE_CHECKING`` imports too) and no file over 800 lines."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "vlastack"
BENCH = PKG.parent / "bench"
MAX_LINES = 800
# Modules whose "module:Class" strings another module imports by name: lister -> resolver.
RESOLVERS = {"vlastack.config.heads": "vlastack.models.heads"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def import_graph(pkg: Path = PKG) -> dict[str, set[str]]:
    """module -> the package modules it imports anywhere in its source (top level, inside functions,
    under ``if TYPE_CHECKING``). ``from a.b import c`` counts as importing ``a.b.c`` when that is a
    module, else ``a.b``."""
    files = {_module_name(p): p for p in pkg.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    registry: dict[str, set[str]] = {}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and ":" in node.value:
                # registry strings ("vlastack.models.heads.flow:FlowHead") are imports made by the
                # module that resolves them (RESOLVERS), not by the one that lists them
                target = node.value.partition(":")[0]
                if target in files and mod in RESOLVERS:
                    registry.setdefault(RESOLVERS[mod], set()).add(target)
                continue
            else:
                continue
            edges.update(n for n in names if n in files and n != mod)
        graph[mod] = edges
    for resolver, targets in registry.items():
        graph[resolver] |= targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return [*stack[stack.index(n) :], n]
            if n not in state and (cycle := visit(n)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_import_graph_sees_lazy_and_type_checking_imports():
    g = import_graph()
    assert "vlastack.models.backbone" in g["vlastack.models.heads.flow.head"]
    assert "vlastack.train.trainer" in g["vlastack.commands.train"]  # an in-function import
    assert "vlastack.models.heads.flow.serving" in g["vlastack.models.heads"]  # a registry string
    assert "vlastack.models.heads.oft" in g["vlastack.models.heads"]  # only ever named by its spec
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_bench_import_graph_sees_in_function_imports():
    g = import_graph(BENCH)
    assert "bench.lerobot_common" in g["bench.libero"]  # inside machine()
    assert "bench.lerobot_metaworld" in g["bench.metaworld"]  # `from bench import lerobot_metaworld`
    assert "bench.common" in g["bench.latency_gpu"]


def test_no_import_cycles_in_bench():
    """bench/'s scripts import one another one way: lerobot_metaworld (the command line) imports
    lerobot_metaworld_eval, and both import lerobot_common, never the other way round."""
    g = import_graph(BENCH)
    assert "bench.lerobot_metaworld_eval" in g["bench.lerobot_metaworld"]
    assert "bench.lerobot_metaworld" not in g["bench.lerobot_metaworld_eval"]
    cycle = find_cycle(g)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_lerobot_metaworld_imports_only_the_standard_library():
    """bench/lerobot_metaworld.py runs under the LeRobot venv's python: it and every bench module
    it imports (anywhere in their source) import nothing outside the standard library."""
    g = import_graph(BENCH)
    todo, seen = ["bench.lerobot_metaworld"], set()
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += g[m]
    outside = set()
    for m in seen:
        path = BENCH.parent / (m.replace(".", "/") + ".py")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                tops = [(node.module or "").split(".")[0]]
            else:
                continue
            outside |= {(m, t) for t in tops if t != "bench" and t not in sys.stdlib_module_names}
    assert seen >= {"bench.lerobot_common", "bench.lerobot_metaworld_eval"}
    assert not outside, sorted(outside)


def test_no_file_over_800_lines():
    root = PKG.parent
    long = {}
    for p in [*PKG.rglob("*.py"), *(root / "tests").rglob("*.py"), *(root / "bench").rglob("*.py")]:
        n = len(p.read_text().splitlines())
        if n > MAX_LINES:
            long[str(p.relative_to(root))] = n
    assert not long, f"files over {MAX_LINES} lines: {long}"


def test_training_layer_does_not_import_the_simulator_or_the_diagnostics():
    """The trainer gets its in-training evaluation and its anomaly handler as callbacks from above
    (``vla train``) and logs peak memory with ``train.logs.peak_memory_mb``: neither ``sim`` nor
    ``diagnostics`` (which imports the trainer's layer) is imported by ``train``'s modules."""
    g = import_graph()
    up = sorted(
        (m, n)
        for m, deps in g.items()
        if m.startswith("vlastack.train.")
        for n in deps
        if n.startswith(("vlastack.sim", "vlastack.diagnostics"))
    )
    assert not up, up


def test_heads_are_asked_never_named_outside_their_folders():
    """Issue #65: outside ``models/heads/`` nothing checks which head a model has (no isinstance of
    a head class, no branch on a head's name), and ``ModelConfig`` holds no head's options (each
    head's live in ``model.head_options``)."""
    from dataclasses import fields

    from vlastack.config import HEAD_SPECS, ModelConfig

    heads = ("FlowHead", "GroundedFlowHead", "TokenHead", "GroundedTokenHead", "OFTHead")
    names = "|".join(HEAD_SPECS)
    import re

    # isinstance of a head class, or any comparison with a head's name (``x.head == "flow"``, a
    # "kind" derived from it: vla rl once branched on ``self.kind == "flow"``).
    pattern = re.compile(
        rf"isinstance\([^)]*\b({'|'.join(heads)})\b|[!=]=\s*[\"']({names})[\"']|[\"']({names})[\"']\s*[!=]="
    )
    # Names that are not a head check: the pre-``head_options`` config section ``model.tokens``
    # (migrated by name), and the heads benchmark, whose rows are heads and which times flow first.
    allowed = {"vlastack/config/io.py", "bench/heads.py"}
    hits = [
        f"{rel}:{i}"
        for root in (PKG, BENCH)
        for p in root.rglob("*.py")
        if "models/heads" not in (rel := p.relative_to(PKG.parent).as_posix()) and rel not in allowed
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not hits, hits
    from vlastack.config.io import LEGACY_HEAD_KEYS  # where heads' options used to live

    assert not set(LEGACY_HEAD_KEYS) & {f.name for f in fields(ModelConfig)}


# vlastack's packages from the bottom up; a package imports only packages of a lower layer (a
# module of its own package aside). ``commands`` holds every ``vla`` subcommand, ``cli`` wires them.
LAYERS = (
    {"fileio", "errors", "folderlock", "progress", "stats"},
    {"config"},
    {"batch"},
    {"nn"},
    {"models"},
    {"data"},
    {"train", "infer"},
    {"sim", "diagnostics"},
    {"rl"},
    {"labs"},
    {"apps"},
    {"commands"},
    {"cli"},
)


def test_no_package_imports_a_layer_above_it():
    """Issue #65: no upward import anywhere (the command-line modules, which import every layer,
    are the top layer, ``vlastack/commands/``, instead of one ``cli.py`` per package)."""
    rank = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    g = import_graph()
    top = {m.split(".")[1] for m in g if m.count(".")} - {"__init__"}
    assert top <= set(rank), f"packages missing from LAYERS: {sorted(top - set(rank))}"
    up = sorted(
        (m, d)
        for m, deps in g.items()
        if m.count(".")
        for d in deps
        if d.count(".") and (a := m.split(".")[1]) != (b := d.split(".")[1]) and rank[b] >= rank[a]
    )
    assert not up, up
