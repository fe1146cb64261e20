"""House rules that can fail: small functions, a thin CLI behind one error handler, no import cycle."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mismatch"
MAX_FUNCTION_LINES = 60  # decorators, signature and docstring included


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


HEAVY = {"torch", "numpy", "pandas", "pyarrow", "transformers", "matplotlib"}  # what computing needs


def test_the_cli_is_thin():
    """The CLI parses, calls one library function and prints: its modules import nothing that computes."""
    paths = sorted(PACKAGE.glob("cli*.py"))  # the app and the command modules it registers
    assert PACKAGE / "cli.py" in paths and len(paths) > 1, paths  # the premise: the CLI's modules are there
    for path in paths:
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
        assert "typer" in imported or path.name == "cli_common.py" or "mismatch" in imported, path.name
        assert not imported & HEAVY, (path.name, imported & HEAVY)


def test_every_command_goes_through_the_one_error_handler():
    """Each registered command is wrapped by `cli_common.command` (one-line errors, interrupts)."""
    from mismatch.cli import app, pairs_app
    from mismatch.cli_common import command

    callbacks = [c.callback for group in (app, pairs_app) for c in group.registered_commands]
    assert len(callbacks) >= 9  # the premise: the commands are registered
    handled = command.__code__.co_consts  # the wrapper's code object, shared by every wrapped command
    wrapper_code = next(c for c in handled if hasattr(c, "co_name") and c.co_name == "register")
    inner = next(c for c in wrapper_code.co_consts if hasattr(c, "co_name") and c.co_name == "wrapper")
    assert [c.__name__ for c in callbacks if c.__code__ is not inner] == []


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


def test_importing_mismatch_changes_no_environment_variable():
    """A user calling `judge` inside their own training loop keeps their hub access and settings."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM")}
    code = ("import os, json; before = dict(os.environ); import mismatch, mismatch.admission, mismatch.cli; "
            "print(json.dumps(sorted(set(os.environ.items()) ^ set(before.items()))))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"
