"""The backend interface every actuator implements, and the error a failed action raises."""

from __future__ import annotations

from typing import Protocol

from faultwatch.actuate.plan import Action
from faultwatch.errors import FaultwatchError


class ActuateError(FaultwatchError):
    """A scheduler refused or failed an action (it is retried, then reported)."""


class Backend(Protocol):
    """Make a scheduler act. `apply` is idempotent or checks the scheduler's state first,
    so replaying an action after a crash is safe; it returns what it did, in words."""

    name: str

    def apply(self, action: Action) -> str: ...
