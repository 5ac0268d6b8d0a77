"""The benches' peers, the tools a bench compares with in the same run (ripgrep, kcat): found
on the PATH, installed on request (`--install-peers`, or `scripts/bench-peers.sh` once), or
the bench exits saying how to get them."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

INSTALLER = Path(__file__).resolve().parents[1] / "scripts" / "bench-peers.sh"
# peer -> (executables that serve, Debian package)
PEERS = {"rg": (("rg",), "ripgrep"), "kcat": (("kcat", "kafkacat"), "kcat")}


def add_argument(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--install-peers", action="store_true",
                    help=f"install a missing peer first ({INSTALLER.name}: Debian packages "
                         f"{', '.join(p for _, p in PEERS.values())})")


def find(name: str) -> str | None:
    return next((p for exe in PEERS[name][0] if (p := shutil.which(exe))), None)


def need(name: str, install: bool = False) -> str:
    """The peer's executable; installed first when `install`; else SystemExit with the
    message that says how to get it (no traceback)."""
    path = find(name)
    if path is None and install:
        subprocess.run(["bash", str(INSTALLER), PEERS[name][1]], check=False)
        path = find(name)
    if path is None:
        bench = Path(sys.argv[0]).name or "bench"
        raise SystemExit(
            f"{bench}: this bench compares with `{name}` (Debian package {PEERS[name][1]}), "
            f"which is not on the PATH: install it with `scripts/bench-peers.sh` (or "
            f"`apt-get install {PEERS[name][1]}`), or run the bench with --install-peers")
    return path
