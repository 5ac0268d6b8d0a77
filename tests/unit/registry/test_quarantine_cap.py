"""A manual quarantine is capped like an automatic one unless --force is given."""

from __future__ import annotations

import pytest

from faultwatch.cli import main
from faultwatch.errors import ConfigError


def test_a_quarantine_beyond_the_cap_needs_force(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["nodes", "--bootstrap", "127.0.0.1:1", "quarantine", "gpu-1", "--for", "100000d",
            "--reason", "typo"]
    assert main(argv) == ConfigError.exit_code
    assert "--force" in capsys.readouterr().err
    assert main(["nodes", "--bootstrap", "127.0.0.1:1", "quarantine", "ALL", "--for", "1h",
                 "--reason", "x"]) == ConfigError.exit_code  # every node to Slurm
