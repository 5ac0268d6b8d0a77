"""The backend interface every actuator implements, and the error a failed action raises."""

from __future__ import annotations

from typing import Protocol

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
