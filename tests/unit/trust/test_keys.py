"""Key files, key ids, trust files and the `faultwatch keys` commands."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from faultwatch.errors import ConfigError
from faultwatch.trust.keys import (
    NODE,
    PROCESSOR,
    generate,
    key_id_of,
    load_signing_key,
    load_trust,
    parse_trust,
    read_signing_key,
)


def test_generate_writes_a_0600_private_key_and_a_trust_line(tmp_path: Path) -> None:
    pub = generate(tmp_path / "p.key", PROCESSOR, "proc-1")
    mode = stat.S_IMODE((tmp_path / "p.key").stat().st_mode)
    assert mode == 0o600
    line = (tmp_path / "p.key.pub").read_text().strip()
    assert line == pub.line() and line.startswith("processor ed25519 ")
    key = read_signing_key(tmp_path / "p.key")
    assert key.key_id == pub.key_id == key_id_of(pub.raw)
    assert "PRIVATE" not in repr(key)  # the key material is never printed
    with pytest.raises(ConfigError, match="never overwritten"):
        generate(tmp_path / "p.key", PROCESSOR)


def test_a_private_key_others_may_read_is_refused(tmp_path: Path) -> None:
    generate(tmp_path / "n.key", NODE, "gpu-1")
    os.chmod(tmp_path / "n.key", 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        read_signing_key(tmp_path / "n.key")


def test_key_files_come_from_flags_or_env_never_argv_values(tmp_path: Path) -> None:
    generate(tmp_path / "o.key", "operator")
    assert load_signing_key(None, {}) is None
    k = load_signing_key(None, {"FAULTWATCH_SIGNING_KEY_FILE": str(tmp_path / "o.key")})
    assert k is not None and len(k.key_id) == 16


def test_trust_file_errors_name_file_and_line(tmp_path: Path) -> None:
    raw = base64.b64encode(b"\1" * 32).decode()
    with pytest.raises(ConfigError, match="t:2"):
        parse_trust(f"processor ed25519 {raw}\nnode ed25519 {raw}\n", "t")  # node: no name
    with pytest.raises(ConfigError, match="role 'admin'"):
        parse_trust(f"admin ed25519 {raw}\n", "t")
    with pytest.raises(ConfigError, match="32 bytes"):
        parse_trust("processor ed25519 AAAA\n", "t")
    with pytest.raises(ConfigError, match="listed twice"):
        parse_trust(f"processor ed25519 {raw}\noperator ed25519 {raw}\n", "t")
    (tmp_path / "trust").write_text(f"# comment\nprocessor ed25519 {raw} p1\n")
    t = load_trust(None, {"FAULTWATCH_TRUST_FILE": str(tmp_path / "trust")})
    assert t is not None and t.keys[0].name == "p1"


def test_keys_cli_generate_and_show(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    out = subprocess.run([sys.executable, "-m", "faultwatch", "keys", "generate", "--node",
                          "gpu-07", "--out", str(tmp_path / "gpu-07.key")],
                         capture_output=True, text=True, env=env, check=True).stdout
    assert "key_id=" in out and "SHA256:" in out and "node ed25519 " in out
    assert out.strip().endswith("gpu-07")
    secret = (tmp_path / "gpu-07.key").read_text()
    body = "".join(secret.splitlines()[1:-1])
    assert body not in out  # the private key is not printed
    shown = subprocess.run([sys.executable, "-m", "faultwatch", "keys", "show",
                            str(tmp_path / "gpu-07.key.pub")], capture_output=True, text=True,
                           env=env, check=True).stdout
    kid = out.split("key_id=")[1].split()[0]
    assert f"key_id={kid}" in shown and "name=gpu-07" in shown
    shown = subprocess.run([sys.executable, "-m", "faultwatch", "keys", "show", "--node",
                            "gpu-07", str(tmp_path / "gpu-07.key")], capture_output=True,
                           text=True, env=env, check=True).stdout
    assert f"key_id={kid}" in shown and body not in shown
