"""The matcher's optional native part (rules/_batchscan.c), or None.

Built by `pip install .` where a C compiler is found (setup.py, optional); without it, or
with FAULTWATCH_NO_NATIVE=1 in the environment, the matcher reads rank prefixes in pure
Python with the same results (tests/unit/rules compare the two readings)."""

from __future__ import annotations

import importlib
from types import ModuleType

from faultwatch import settings

NO_NATIVE_ENV = settings.NO_NATIVE.name


def batchscan() -> ModuleType | None:
    """faultwatch.rules._batchscan, or None when it is not built or turned off."""
    if settings.NO_NATIVE.value():
        return None
    try:
        # (by name: the C module imports nothing, and the layer checks read Python sources)
        return importlib.import_module("faultwatch.rules._batchscan")
    except ImportError:
        return None
