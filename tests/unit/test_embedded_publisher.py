"""Embedded mode's publisher: decisions for a person on the terminal, every one in the file."""

from __future__ import annotations

import io
from pathlib import Path

import orjson

from faultwatch.cli.run import publisher
from faultwatch.core.diagnosis import DIAGNOSE_KIND
from faultwatch.core.events import Decision


def _decision(did: str, action: str, kind: str) -> Decision:
    return Decision(id=did, job="j", attempt=0, action=action, kind=kind, ts=1.0,
                    nodes=["n0"], evidence={})


def test_diagnose_probes_stay_off_the_terminal_but_reach_the_file(tmp_path: Path) -> None:
    out = io.StringIO()
    path = tmp_path / "decisions.jsonl"
    publish = publisher(out, path)
    publish(_decision("probe1", "notify", DIAGNOSE_KIND))
    publish(_decision("restart1", "restart", "error"))  # positive control: printed
    text = out.getvalue()
    assert "restart1" in text and "RESTART" in text
    assert "probe1" not in text
    ids = [orjson.loads(x)["id"] for x in path.read_bytes().splitlines()]
    assert ids == ["probe1", "restart1"]
