"""What the hang matrix's three jobs share (hang_matrix_job.py, hang_matrix_trainer.py,
hang_matrix_lightning.py; each imports this file from its own directory): the schedule of
scenarios from the environment, marks, a silent CPU burn and the upload to a slow object store.
"""

import http.client
import os
import subprocess
import sys
import time

import torch

RANK = int(os.environ.get("RANK", "0"))
SILENCE_S = float(os.environ.get("FW_SILENCE_S", "20"))


def schedule(default_plays: str, first_at: int, gap: int) -> dict[int, str]:
    """step -> scenario: FW_SCENARIO's names (comma-separated), FW_GAP steps apart from FW_AT."""
    plays = [p for p in os.environ.get("FW_SCENARIO", default_plays).split(",") if p]
    first = int(os.environ.get("FW_AT", str(first_at)))
    every = int(os.environ.get("FW_GAP", str(gap)))
    return {first + i * every: name for i, name in enumerate(plays)}


def mark(event: str, scenario: str) -> None:
    """`<event>:<scenario> <rank> <unix time>` to $FW_MARKS, never to the output."""
    if os.environ.get("FW_MARKS"):
        with open(os.environ["FW_MARKS"], "a") as f:
            f.write(f"{event}:{scenario} {RANK} {time.time()}\n")


def burn(seconds: float) -> None:
    """CPU work with no output (an evaluation, a compiler, a decoder)."""
    end, x = time.monotonic() + seconds, torch.randn(64, 64)
    while time.monotonic() < end:
        x = torch.tanh(x @ x.T / 64)


SLOW_STORE = """
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
end, size, n = time.monotonic() + float(sys.argv[1]), int(sys.argv[2]), 0
while n < size:
    got = c.recv(4096 if time.monotonic() < end else 1 << 20)  # slow, then done
    if not got:
        break
    n += len(got)
    if time.monotonic() < end:
        time.sleep(0.05)
c.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: 0\\r\\n\\r\\n")
"""
UPLOAD_BYTES = 32 << 20  # the checkpoint, padded to outlast the socket buffers


def upload(path: str = "/bucket/checkpoint") -> None:
    """PUT the checkpoint bytes to an object store that reads slowly for FW_SILENCE_S (a local
    server process), through http.client (as SDKs do)."""
    store = subprocess.Popen([sys.executable, "-c", SLOW_STORE, str(SILENCE_S),
                              str(UPLOAD_BYTES)], stdout=subprocess.PIPE, text=True)
    assert store.stdout is not None
    port = int(store.stdout.readline())
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=SILENCE_S + 60)
    conn.request("PUT", path, body=bytes(UPLOAD_BYTES))
    conn.getresponse().read()
    store.wait(30)
