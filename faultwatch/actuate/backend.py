"""The backend interface every actuator implements, the options and construction it declares as
a plug-in (actuate/plugins.py), and the error a failed action raises."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from faultwatch.actuate.plan import Action
from faultwatch.errors import FaultwatchError


class ActuateError(FaultwatchError):
    """A scheduler refused or failed an action: retried, then reported; a `permanent` one
    (no permission, no such node) is reported once with its cause and not retried."""

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class Backend(Protocol):
    """Make a scheduler act. `apply` is idempotent or checks the scheduler's state first,
    so replaying an action after a crash is safe; it returns what it did, in words."""

    name: str

    def apply(self, action: Action) -> str: ...


@dataclass(frozen=True)
class Option:
    """One option a backend takes (its `--flag` on `faultwatch actuate`); the backend's
    build() gets the values of its own options by dest, never the whole command line."""

    flag: str
    help: str = ""
    default: Any = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


class Plugin(Protocol):
    """What an actuator module declares (actuate/plugins.py lists the modules): its name,
    the title of its option group, its options, and how it is built from their values."""

    NAME: str
    TITLE: str
    OPTIONS: tuple[Option, ...]

    def build(self, opts: Mapping[str, Any]) -> Backend: ...
