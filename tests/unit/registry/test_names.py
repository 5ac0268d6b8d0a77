"""Actuate's job-name rule is the agent's: both ask core/names.name_problem."""

from __future__ import annotations

import pytest

from faultwatch.errors import ConfigError, DecodeError
from faultwatch.registry.names import valid_job
from faultwatch.wire._check import MAX_ID_CHARS, safe_name

SAMPLES = ["train", "x y", "a;b", "-leading", "", "x" * MAX_ID_CHARS,
           "x" * (MAX_ID_CHARS + 1), "a\nb", "a\x7fb", "a\x85b", "ünï", "<!channel>"]


@pytest.mark.parametrize("name", SAMPLES)
def test_valid_job_and_safe_name_agree(name: str) -> None:
    try:
        safe_name(name, "job")
        wire_ok = True
    except DecodeError:
        wire_ok = False
    try:
        valid_job(name)
        ours = True
    except ConfigError:
        ours = False
    assert ours == wire_ok
