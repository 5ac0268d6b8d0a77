"""The training SDK: a silent no-op without an agent, never blocking; the agent's receiver."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from faultwatch import sdk
from faultwatch.agents.sdk_server import SdkServer


class Receiver:
    """A stand-in agent: a listening Unix stream socket; lines() reads what arrived."""

    def __init__(self, path: str):
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(8)
        self.srv.settimeout(2)
        self.conn: socket.socket | None = None
        self.buf = b""

    def lines(self, n: int) -> list[dict[str, Any]]:
        if self.conn is None:
            self.conn, _ = self.srv.accept()
            self.conn.settimeout(2)
        while self.buf.count(b"\n") < n:
            self.buf += self.conn.recv(65536)
        *got, self.buf = self.buf.split(b"\n", n)
        return [orjson.loads(x) for x in got]


@pytest.fixture
def receiver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Receiver:
    path = str(tmp_path / "s.sock")
    r = Receiver(path)
    monkeypatch.setenv(sdk.SOCKET_ENV, path)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setattr(sdk, "PROGRESS_MIN_INTERVAL_S", 0.0)
    monkeypatch.setattr(sdk, "_channel", sdk._Channel())
    return r


def msgs(r: Receiver, n: int) -> list[dict[str, Any]]:
    return r.lines(n)


def test_without_an_agent_everything_is_a_silent_noop(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    monkeypatch.delenv(sdk.SOCKET_ENV, raising=False)
    assert not sdk.enabled()
    sdk.progress(1, loss=0.5)
    sdk.notify("hi")
    sdk.set_retryable_errors(["x"])

    @sdk.stage("eval", hang_window_s=None)
    def f(x: int) -> int:
        return x + 1

    with sdk.stage("init", hang_window_s=60):
        assert f(1) == 2
    assert sdk.StepMonitor().step(0, loss=float("nan")) is None
    # an agent that went away: the socket path does not exist
    monkeypatch.setenv(sdk.SOCKET_ENV, str(tmp_path / "gone.sock"))
    sdk.notify("nobody listens")
    with sdk.stage("x", hang_window_s=1):
        pass


def test_messages_carry_kind_rank_and_contract_fields(receiver: Receiver) -> None:
    sdk.progress(7, loss=0.25, lr=1e-4, step_time_s=0.5)
    with sdk.stage("ckpt", hang_window_s=None):
        pass
    sdk.notify("loss spiked", level="info")
    sdk.set_retryable_errors(["NCCL timeout", r"Socket Timeout"])
    got = msgs(receiver, 5)
    assert [m["k"] for m in got] == ["progress", "stage", "stage", "notify", "retryable_errors"]
    assert {m["rank"] for m in got} == {3}
    assert got[0]["d"] == {"step": 7, "metrics": {"loss": 0.25, "lr": 1e-4}, "step_time_s": 0.5}
    assert got[1]["d"] == {"stage": "ckpt", "opens": True, "hang_window_s": None}
    assert got[2]["d"]["opens"] is False
    assert got[3]["d"] == {"message": "loss spiked", "level": "info"}
    assert got[4]["d"] == {"patterns": ["NCCL timeout", "Socket Timeout"]}


def test_step_monitor_times_steps_and_notifies_nan_once(receiver: Receiver) -> None:
    mon = sdk.StepMonitor(nan_notify_every=100)
    assert mon.step(0, loss=1.0) is None
    time.sleep(0.01)
    dt = mon.step(1, loss=float("nan"))
    assert dt is not None and dt >= 0.01
    mon.step(2, loss=float("inf"))  # within 100 steps of the last notice: no second one
    got = msgs(receiver, 4)
    kinds = [m["k"] for m in got]
    assert kinds == ["progress", "notify", "progress", "progress"], kinds
    note = next(m for m in got if m["k"] == "notify")
    assert note["d"]["level"] == "error" and "nan" in note["d"]["message"]
    prog = [m["d"] for m in got if m["k"] == "progress"]
    assert prog[1]["metrics"]["loss"] == "nan" and prog[1]["step_time_s"] >= 0.01


def test_a_full_agent_buffer_drops_and_never_blocks(receiver: Receiver) -> None:
    sdk.notify("first")
    receiver.lines(1)  # connected; from now on nobody reads: the socket buffer fills
    before = sdk._channel.dropped
    t0 = time.perf_counter()
    for i in range(20000):
        sdk.notify("x" * 200 + str(i))
    took = time.perf_counter() - t0
    assert sdk._channel.dropped > before
    assert took < 3.0  # microseconds per call; a blocking send would hang here


def test_server_forwards_notes_and_coalesces_progress(tmp_path: Path) -> None:
    notes: list[tuple[str, dict[str, Any]]] = []

    async def main() -> None:
        srv = SdkServer(lambda k, d, ts: notes.append((k, d)), lambda *a, **k: None, tmp_path)
        await srv.start()
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.connect(srv.path)

        def send(kind: str, rank: int | None, d: dict[str, Any]) -> None:
            c.sendall(orjson.dumps({"k": kind, "rank": rank, "ts": 1.0, "d": d}) + b"\n")

        for step in range(50):  # a fast loop: one note now, the latest one later
            send("progress", 0, {"step": step, "metrics": {}})
        send("stage", 0, {"stage": "eval", "opens": True, "hang_window_s": None})
        c.sendall(b"not json\n")
        await asyncio.sleep(0.2)
        c.close()
        await srv.close()

    asyncio.run(main())
    assert notes[0] == ("progress", {"rank": 0, "step": 0, "metrics": {}})
    assert ("stage", {"rank": 0, "stage": "eval", "opens": True, "hang_window_s": None}) in notes
    assert notes[-1] == ("progress", {"rank": 0, "step": 49, "metrics": {}})  # flushed on close
    assert len([n for n in notes if n[0] == "progress"]) == 2
