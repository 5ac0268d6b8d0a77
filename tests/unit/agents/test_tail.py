"""Tailer on real files: new lines, partial lines, rotation, truncation, resume from state."""

from __future__ import annotations

import os
from pathlib import Path

from faultwatch.agents.config import AgentConfig
from faultwatch.agents.tail import Tailer
from faultwatch.core.events import Line


def make(paths: list[Path], state: dict | None = None  # type: ignore[type-arg]
         ) -> tuple[Tailer, list[Line]]:
    got: list[Line] = []
    cfg = AgentConfig(bootstrap="x:1", job="j", node="n", cmd=(), spool_dir=Path("/tmp"))
    t = Tailer([str(p) for p in paths], state or {}, cfg, got.extend, lambda *a, **k: None)
    return t, got


def texts(lines: list[Line]) -> list[str]:
    return [ln.text for ln in lines]


def test_follow_partial_lines_rotation_and_truncation(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("a\nb\npart")
    t, got = make([log])
    t.poll()
    assert texts(got) == ["a", "b"]
    with log.open("a") as f:
        f.write("ial\nc\n")
    t.poll()
    assert texts(got) == ["a", "b", "partial", "c"]
    # rotation: rename + new file; the old file's last lines come first
    with log.open("a") as f:
        f.write("last of old\n")
    os.rename(log, tmp_path / "train.log.1")
    log.write_text("new 1\n")
    t.poll()
    t.poll()
    assert texts(got)[4:] == ["last of old", "new 1"]
    # truncation (copytruncate), then new content shorter than the old offset
    with log.open("w") as f:
        f.write("after truncate\n")
    t.poll()
    assert texts(got)[-1] == "after truncate"
    assert [ln.seq for ln in got] == list(range(len(got)))  # one sequence across files
    t.close()


def test_resume_from_state_without_duplicates_or_loss(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    missing = tmp_path / "later.log"
    log.write_text("1\n2\nhalf")
    t, got = make([log, missing])
    t.poll()
    state = t.state()
    assert state["next_seq"] == 2 and state["files"][str(log)]["offset"] == 4
    assert str(missing) not in state["files"]
    # a new tailer (agent restarted) continues where the state says
    with log.open("a") as f:
        f.write(" done\n3\n")
    missing.write_text("appeared\n")
    t2, got2 = make([log, missing], state)
    t2.poll()
    assert texts(got2) == ["half done", "3", "appeared"]
    assert [ln.seq for ln in got2] == [2, 3, 4]
    # rotated while the agent was down: the new file is read from its start
    st = t2.state()
    os.rename(log, tmp_path / "x.log.1")
    log.write_text("fresh\n")
    t3, got3 = make([log], st)
    t3.poll()
    assert texts(got3) == ["fresh"]
