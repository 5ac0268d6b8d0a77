"""A bench whose peer (rg, kcat) is not on the PATH exits with a message that says how to get
it, not a traceback; with the peer there it is found (the control)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _bench(script: str, path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": str(path)}
    return subprocess.run([sys.executable, str(REPO / "bench" / script), *args], env=env,
                          capture_output=True, text=True, timeout=120, cwd=REPO)


@pytest.mark.parametrize(("script", "peer", "args"), [
    ("matcher_throughput.py", "rg", ("--lines", "20")),
    ("agent_throughput.py", "kcat", ("--bootstrap", "127.0.0.1:9"))])
def test_a_bench_without_its_peer_says_how_to_install_it(
        tmp_path: Path, script: str, peer: str, args: tuple[str, ...]) -> None:
    out = _bench(script, tmp_path, *args)  # an empty PATH: no peer
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert f"compares with `{peer}`" in out.stderr and "scripts/bench-peers.sh" in out.stderr
    assert "--install-peers" in out.stderr


@pytest.mark.parametrize(("peer", "exe"), [("rg", "rg"), ("kcat", "kafkacat")])
def test_with_its_peer_on_the_path_the_bench_gets_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, peer: str, exe: str) -> None:
    """The control, in-process (the whole bench with a stand-in peer costs ~4 CPU s)."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import peers
    finally:
        sys.path.remove(str(REPO / "bench"))
    stub = tmp_path / exe
    stub.write_text("#!/bin/sh\necho 0\n")
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert peers.need(peer) == str(stub)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(SystemExit, match="scripts/bench-peers.sh"):
        peers.need(peer)
