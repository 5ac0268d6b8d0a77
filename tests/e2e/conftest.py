"""End-to-end tests: real torchrun jobs on gloo (CPU) under faultwatch (helpers: tests/support)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _torch_available() -> None:
    # torch is part of the test install (`.[torch,test]`); a missing torch is a broken
    # install, not a reason to skip end-to-end tests.
    import torch  # noqa: F401
