"""The actuator plug-ins: one module per scheduler, each declaring its name, its options and
how it is built (actuate/backend.Plugin). A new backend is a module and one line here; the
CLI adds every plug-in's options and builds the chosen one from its own values."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, cast

from faultwatch.actuate.backend import Backend, Plugin

MODULES = ("faultwatch.actuate.slurm", "faultwatch.actuate.kubernetes",
           "faultwatch.actuate.exec")


def plugins() -> dict[str, Plugin]:
    """name -> plug-in module, in MODULES order."""
    mods = [cast(Plugin, importlib.import_module(m)) for m in MODULES]
    return {m.NAME: m for m in mods}


def names() -> tuple[str, ...]:
    return tuple(plugins())


def build(name: str, values: Mapping[str, Any]) -> Backend:
    """The backend `name`, built from the values of its own options (by dest; a missing one
    takes the option's default)."""
    plugin = plugins()[name]
    return plugin.build({o.dest: values.get(o.dest, o.default) for o in plugin.OPTIONS})
