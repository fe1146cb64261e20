"""`mismatch.lazy`: a package's public names load on first use, once, and an unknown name is the usual error."""

import subprocess
import sys

import pytest

from mismatch.lazy import lazy


def test_a_name_loads_on_first_use_and_is_cached():
    namespace = {"__name__": "pkg"}
    getattr_, dir_ = lazy(namespace, {"dumps": "json", "decode": ("json", "loads")}, submodules=("path",))
    assert "dumps" not in namespace and {"dumps", "decode", "path"} <= set(dir_())
    import json

    assert getattr_("dumps") is json.dumps and namespace["dumps"] is json.dumps  # cached: no second lookup
    assert getattr_("decode") is json.loads
    with pytest.raises(ModuleNotFoundError, match="'pkg'"):  # a submodule is `pkg.<name>`: no such package here
        getattr_("path")
    with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'nope'"):
        getattr_("nope")


def test_importing_a_lazy_package_imports_none_of_its_modules():
    code = ("import sys, mismatch.opd, mismatch.rollout, mismatch.pairs, mismatch.dumps, mismatch.admission; "
            "print(sorted(m for m in sys.modules if m.count('.') == 2 and m.split('.')[1] in "
            "('opd', 'rollout', 'pairs', 'dumps', 'admission')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"
