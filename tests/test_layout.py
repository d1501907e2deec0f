"""The repository's shape: no import cycles between rynn_jax's top-level packages, no oversized files."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rynn_jax"
MAX_LINES = 600

# (importing file, imported top-level package) edges left out of the graph, each with its reason.
ALLOWED = {
    # The skeleton preview's .mp4 writer is the data pipeline's PyAV writer (one H.264 writer in the
    # repository); imported when an .mp4 is written. The data package renders skeletons (render/).
    ("rynn_jax/render/preview.py", "data"),
}


def _node(module: str) -> str | None:
    """The top-level package or module of rynn_jax that `module` (dotted) lies in."""
    parts = module.split(".")
    return parts[1] if parts[0] == "rynn_jax" and len(parts) > 1 else None


def import_edges() -> dict[str, dict[str, list[str]]]:
    """node → imported node → the files that import it: every import in the file (module level,
    function-local and TYPE_CHECKING alike), between distinct top-level nodes of rynn_jax."""
    edges: dict[str, dict[str, list[str]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if len(rel.parts) < 3 and rel.name == "__init__.py":
            continue
        here = rel.parts[1].removesuffix(".py")
        package = ".".join(rel.with_suffix("").parts[:-1])  # for relative imports
        for node in ast.walk(ast.parse(path.read_text(), str(rel))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                there = _node(target)
                if there is None or there == here or (str(rel), there) in ALLOWED:
                    continue
                if (PACKAGE / there).is_dir() or (PACKAGE / f"{there}.py").is_file():  # not a re-exported name
                    edges[here][there].append(str(rel))
    return edges


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state and (cycle := visit(w)):
                return cycle
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state and (cycle := visit(v)):
            return cycle
    return None


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycles_between_top_level_packages():
    edges = import_edges()
    assert edges["serving"]["models"] and edges["teleop"]["serving"]  # the scan sees real imports
    cycle = find_cycle({a: set(b) for a, b in edges.items()})
    if cycle:
        detail = "; ".join(f"{a} → {b} ({', '.join(sorted(set(edges[a][b])))})" for a, b in zip(cycle, cycle[1:]))
        raise AssertionError(f"import cycle {' → '.join(cycle)}: {detail}")


def test_no_file_over_600_lines():
    files = [*PACKAGE.rglob("*.py"), *ROOT.glob("*.py"), *(ROOT / "bench").rglob("*.py")]
    assert len(files) > 100
    long = {str(f.relative_to(ROOT)): n for f in files if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines: {long}"
