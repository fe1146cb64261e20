"""House rules that can fail: a thin CLI behind one error handler, no import cycle, no upward import,
no environment write on import. Each test checks its premise first, so a moved file fails it instead of
letting it pass vacuously."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mismatch"


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _typing_only(tree: ast.AST) -> set[int]:
    """Ids of the nodes inside `if TYPE_CHECKING:` blocks: annotations only, never imported at run time."""
    return {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
            and getattr(block.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(block)}


HEAVY = {"torch", "numpy", "pandas", "pyarrow", "transformers", "matplotlib"}  # what computing needs


def test_the_cli_is_thin():
    """The CLI parses, calls one library function and prints: its modules import nothing that computes."""
    paths = sorted((PACKAGE / "cli").glob("*.py"))  # the app and the command modules it registers
    assert PACKAGE / "cli" / "app.py" in paths and len(paths) > 3, paths  # the premise: the CLI's modules are there
    for path in paths:
        imported = set()
        tree = ast.parse(path.read_text())
        typing_only = _typing_only(tree)
        for node in ast.walk(tree):
            if id(node) in typing_only:  # annotations only: never imported at run time
                continue
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
        assert "typer" in imported or path.name in ("common.py", "__init__.py") or "mismatch" in imported, path.name
        assert not imported & HEAVY, (path.name, imported & HEAVY)


def test_every_command_goes_through_the_one_error_handler():
    """Each registered command is wrapped by `cli_common.command` (one-line errors, interrupts)."""
    from mismatch.cli.app import app, pairs_app
    from mismatch.cli.common import command

    callbacks = [c.callback for group in (app, pairs_app) for c in group.registered_commands]
    assert len(callbacks) >= 9  # the premise: the commands are registered
    handled = command.__code__.co_consts  # the wrapper's code object, shared by every wrapped command
    wrapper_code = next(c for c in handled if hasattr(c, "co_name") and c.co_name == "register")
    inner = next(c for c in wrapper_code.co_consts if hasattr(c, "co_name") and c.co_name == "wrapper")
    assert [c.__name__ for c in callbacks if c.__code__ is not inner] == []


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Modules of the package that `module` imports, at module level or inside functions (a deferred
    import is how a cycle hides: it still ties the two modules together); not those imported for
    annotations only (`if TYPE_CHECKING:`), which never run."""
    out = set()
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text())
    typing_only = _typing_only(tree)
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
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
    """A user calling `judge` inside their own training loop keeps their hub access and settings.

    torch itself sets `TORCHINDUCTOR_CACHE_DIR` when `torch._dynamo` is imported (transformers' modeling
    code does, so any transformers user gets it): the child imports torch and transformers first, and
    every variable mismatch's own modules then change is a failure. The premise: that child's variables
    differ from the parent's only by what torch set (`HF_HUB_OFFLINE` etc. removed, as a user has them)."""
    import os
    import subprocess
    import sys

    ours = ("HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM", "TORCHINDUCTOR_CACHE_DIR", "TRANSFORMERS_VERBOSITY")
    env = {k: v for k, v in os.environ.items() if k not in ours}
    code = ("import os, json; import torch, transformers.modeling_utils; before = dict(os.environ); "
            "import mismatch, mismatch.admission.checker, mismatch.cli.app, mismatch.probes.runs, mismatch.opd.trainer, "
            "mismatch.sweep, mismatch.report, mismatch.dumps.score, mismatch.rollout.copy, mismatch.integrations.trl, "
            "mismatch.monitor.drift; import mismatch.perturb.backends as b; "
            "print(json.dumps(sorted(set(os.environ.items()) ^ set(before.items()))))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_reports_read_results_and_instantiate_no_model():
    """`mismatch/report/` imports neither torch nor transformers nor the modules that load, build or train
    models: what a report needs (cost factors, sizes) is on the rows."""
    builders = {"mismatch.model.loader", "mismatch.pairs.build", "mismatch.opd.trainer", "mismatch.probes.core",
                "mismatch.probes.runs", "mismatch.rollout.llamacpp"}
    modules = _modules()
    reports = {m: p for m, p in modules.items() if m.startswith("mismatch.report")}
    assert len(reports) >= 8  # the premise: the report modules are read
    for module, path in reports.items():
        found = _imports(module, path, modules)
        tree = ast.parse(path.read_text())
        third = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | {
            n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level}
        assert not found & builders and not third & {"torch", "transformers"}, (module, found & builders)


def design_layers(path: Path = PACKAGE.parent / "docs" / "design.md") -> dict[str, int]:
    """The package map of docs/design.md (its one copy): each room (`model`, `errors`, …) → its layer."""
    text = path.read_text(encoding="utf-8")
    section = text[text.index("### Layers"):text.index("### Two call paths")]
    layers = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].isdigit():
            for name in cells[1].split(","):
                layers[name.strip().strip("`").removesuffix("/").removesuffix(".py")] = int(cells[0])
    return layers


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_import_keeps_the_layers_the_design_page_promises():
    """The layers of docs/design.md hold: every module of the tree has its row, no row names a module the
    tree lacks, and every import (at module level or deferred, not typing-only) goes to the same or a lower
    layer — so no arrow runs up, directly or through others."""
    layers = design_layers()
    modules = _modules()
    rooms = {_room(m) for m in modules} - {""}
    assert len(layers) >= 20 and rooms == set(layers), (sorted(rooms - set(layers)), sorted(set(layers) - rooms))
    upward = sorted({(m, d) for m, p in modules.items() if m != "mismatch" for d in _imports(m, p, modules)
                     if _room(d) and layers[_room(d)] > layers[_room(m)]})
    assert upward == [], "imports that run up the layers: " + ", ".join(f"{m} -> {d}" for m, d in upward)


def test_reading_results_imports_no_torch():
    """`import mismatch.report` (and the analysis, the fitted limits, the pair catalogue, the rollout spec)
    leaves torch and transformers unloaded, in a fresh process: reports build where no torch is installed."""
    import subprocess
    import sys

    code = ("import sys; import mismatch.report, mismatch.analysis.tolerance, mismatch.analysis.length, "
            "mismatch.admission.thresholds, mismatch.pairs.catalog, mismatch.rollout.spec, mismatch.opd.config; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"
    premise = subprocess.run([sys.executable, "-c", "import sys, mismatch.opd.trainer; print('torch' in sys.modules)"],
                             capture_output=True, text=True, check=True)
    assert premise.stdout.strip().splitlines()[-1] == "True"  # the check can see torch when it is loaded


def test_every_module_has_its_api_page():
    """Each module of the package is rendered on one page of docs/api (mkdocstrings' `::: module`), the CLI
    aside (documented by `--help`); no page renders a module the tree lacks."""
    import re

    pages = sorted((PACKAGE.parent / "docs" / "api").glob("*.md"))
    rendered = {m for p in pages for m in re.findall(r"^::: (\S+)$", p.read_text(encoding="utf-8"), re.M)}
    modules = {m for m in _modules() if not m.startswith("mismatch.cli") and m != "mismatch"}
    packages = {m for m, p in _modules().items() if p.name == "__init__.py"}
    assert len(rendered) > 60  # the premise: the pages were read
    assert sorted(modules - rendered - packages) == [] and sorted(rendered - set(_modules())) == []
