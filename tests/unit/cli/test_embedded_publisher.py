"""Embedded mode's channels: decisions for a person (terminal, --decisions-out), probes on
the in-process control channel only (--control-out), never among the decisions."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import orjson

from faultwatch.agents.transport import LocalTransport
from faultwatch.cli.run import _appender, publisher
from faultwatch.core.diagnosis import DIAGNOSE_KIND
from faultwatch.core.events import Decision


def _decision(did: str, action: str, kind: str) -> Decision:
    return Decision(id=did, job="j", attempt=0, action=action, kind=kind, ts=1.0,
                    nodes=("n0",), evidence={})


class _Pipeline:
    """Returns the given decisions for the next submitted record."""

    def __init__(self, decs: list[Decision]) -> None:
        self.decs = decs

    def submit(self, key: bytes, value: bytes, now: float) -> list[Decision]:
        out, self.decs = self.decs, []
        return out

    def tick(self, now: float) -> list[Decision]:
        return []


def test_probes_take_the_control_channel_and_decisions_the_decisions_one(tmp_path: Path
                                                                         ) -> None:
    out = io.StringIO()
    decisions, control = tmp_path / "decisions.jsonl", tmp_path / "control.jsonl"
    probe = _decision("probe1", "notify", DIAGNOSE_KIND)
    restart = _decision("restart1", "restart", "error")  # positive control
    notice = _decision("slow1", "notify", "slow")  # a notice a person reads stays a decision
    t = LocalTransport(_Pipeline([probe, restart, notice]), "j", publisher(out, decisions),
                       clock=lambda: 1.0, publish_control=_appender(control))
    t.submit(b"record")

    async def drain() -> tuple[list[str], list[str]]:
        got_d, got_c = [], []
        while (d := await t.decisions.get(0.01)) is not None:
            got_d.append(d.id)
        while (c := await t.control.get(0.01)) is not None:
            got_c.append(c.id)
        return got_d, got_c

    got_d, got_c = asyncio.run(drain())
    assert got_d == ["restart1", "slow1"] and got_c == ["probe1"]
    text = out.getvalue()
    assert "restart1" in text and "RESTART" in text and "probe1" not in text
    assert [orjson.loads(x)["id"] for x in decisions.read_bytes().splitlines()] == \
        ["restart1", "slow1"]
    assert [orjson.loads(x)["id"] for x in control.read_bytes().splitlines()] == ["probe1"]
