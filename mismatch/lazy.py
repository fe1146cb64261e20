"""Public names a package loads on first use, so importing the package costs nothing it does not need.

A package's `__init__` says where each of its names lives and installs the module hooks (PEP 562):

    __getattr__, __dir__ = lazy(globals(), {"OPDConfig": "mismatch.opd.config", …})

`import mismatch.opd` then imports no module of it, and no torch; `mismatch.opd.OPDConfig` imports
`mismatch.opd.config` once and caches the name in the package's namespace.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping


def lazy(namespace: dict, exports: Mapping[str, str | tuple[str, str]], *, submodules: Iterable[str] = ()
         ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of a package whose public names are `exports` (name → module, or
    name → (module, attribute) where the module calls it otherwise) and its `submodules` (`mismatch.opd`)."""
    where: dict[str, tuple[str, str | None]] = {
        name: (spec, name) if isinstance(spec, str) else spec for name, spec in exports.items()}
    where |= {name: (f"{namespace['__name__']}.{name}", None) for name in submodules}

    def __getattr__(name: str) -> object:
        if name not in where:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        module, attribute = where[name]
        value = importlib.import_module(module)
        value = value if attribute is None else getattr(value, attribute)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *where})

    return __getattr__, __dir__
