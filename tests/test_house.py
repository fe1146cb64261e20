"""House rules that can fail: small functions, a thin CLI, no import cycle inside the package."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mismatch"
MAX_FUNCTION_LINES = 60  # decorators, signature and docstring included
MAX_CLI_LINES = 200


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            yield node.name, node.end_lineno - start + 1


def test_no_function_is_longer_than_the_limit():
    long = [(f"{path.relative_to(PACKAGE.parent)}:{name}", n) for path in _modules().values()
            for name, n in _functions(path) if n > MAX_FUNCTION_LINES]
    assert long == []


def test_the_cli_is_thin():
    paths = sorted(PACKAGE.glob("cli*.py"))  # the app and the command modules it registers
    assert PACKAGE / "cli.py" in paths and len(paths) > 1, paths  # the premise: the CLI's modules are there
    for path in paths:
        assert len(path.read_text().splitlines()) <= MAX_CLI_LINES, path.name


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Modules of the package that `module` imports, at module level or inside functions (a deferred
    import is how a cycle hides: it still ties the two modules together)."""
    out = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(anchor[:len(anchor) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        out |= {n for n in names if n in modules and n != module}
    return out


def import_cycle(package: Path = PACKAGE) -> list[str] | None:
    """The first import cycle among the package's modules, or None."""
    modules = _modules(package)
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    # a package's __init__ re-exporting its modules is the one allowed direction of a package edge
    for m in graph:
        graph[m] = {d for d in graph[m] if not m.startswith(d + ".")}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> list[str] | None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return trail[trail.index(dep):] + [dep]
            found = visit(dep, trail + [dep]) if dep not in state else None
            if found:
                return found
        state[node] = 2
        return None

    for m in sorted(graph):
        found = visit(m, [m]) if m not in state else None
        if found:
            return found
    return None


def test_no_import_cycle_inside_the_package():
    cycle = import_cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
