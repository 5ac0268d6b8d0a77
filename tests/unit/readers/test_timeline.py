"""A job's timeline (readers/timeline.py) and how `faultwatch logs` renders it."""

from __future__ import annotations

import io

import orjson
from rich.console import Console

from faultwatch.core.events import Decision, RunStart
from faultwatch.readers.render import ROW_FIELDS, render_plain, render_row, row_json
from faultwatch.readers.timeline import (
    ATTEMPT,
    LINE,
    Row,
    Timeline,
    decision_row,
    start_row,
)


def line(seq: int, node: str = "n1", attempt: int = 0, text: str = "x",
         stream: str = "stdout", rank: int | None = 0) -> Row:
    return Row(LINE, 100.0 + seq, "j", "R1", attempt, text, node=node, rank=rank,
               stream=stream, seq=seq)


def restart(attempt: int, run_id: str = "R1") -> Decision:
    return Decision(id=f"d{attempt}", job="j", attempt=attempt, action="restart", kind="error",
                    ts=150.0, nodes=("n2",), rule="nccl-timeout",
                    message="NCCL timeout on n2 rank 3", run_id=run_id)


def test_a_line_delivered_twice_is_shown_once() -> None:
    tl = Timeline()
    assert tl.feed(line(1)) is not None
    assert tl.feed(line(1)) is None  # redelivered
    assert tl.feed(line(1, node="n2")) is not None  # another node's seq 1
    assert tl.feed(line(1, attempt=1)) is not None  # seq restarts with each attempt
    assert tl.feed(line(1, stream="stderr")) is not None


def test_one_separator_per_attempt_naming_the_restart_that_caused_it() -> None:
    tl = Timeline()
    first = tl.feed(start_row(RunStart("j", 0, "n1", 100.0, run_id="R1")))
    assert first is not None and first.kind == ATTEMPT and first.decision is None
    assert tl.feed(start_row(RunStart("j", 0, "n2", 100.1, run_id="R1"))) is None
    d = tl.feed(decision_row(restart(0)))
    assert d is not None and tl.feed(decision_row(restart(0))) is None  # each id once
    sep = tl.feed(start_row(RunStart("j", 1, "n2", 160.0, run_id="R1")))
    assert sep is not None and sep.decision is not None and sep.decision["id"] == "d0"
    text = render_row(sep).plain
    assert "attempt 1 of j (run R1) starts" in text
    assert "after restart decision d0 (error, rule nccl-timeout)" in text
    assert "NCCL timeout on n2 rank 3" in text
    other_run = tl.feed(start_row(RunStart("j", 1, "n1", 161.0, run_id="R2")))
    assert other_run is not None and other_run.decision is None  # another run's restart


def test_rendered_rows_have_time_prefix_and_stderr_marker_and_no_control_chars() -> None:
    evil = "boom\r\x1b[2K\nforged"
    out = render_row(line(1, text=evil, stream="stderr", rank=3)).plain
    assert out.endswith("[n1/rank3 !] boom\\r\\x1b[2K\\nforged")
    assert out[:12].count(":") == 2 and out[8] == "."  # HH:MM:SS.mmm
    assert "\n" not in out and "\x1b" not in out
    assert "[n1] x" in render_row(line(2, rank=None)).plain
    assert render_plain(line(1, text=evil, stream="stderr", rank=3)) == out  # the pipe's path


def test_colour_on_a_terminal_plain_in_a_pipe() -> None:
    row = line(1, stream="stderr")
    term = io.StringIO()
    Console(file=term, force_terminal=True, color_system="standard").print(render_row(row))
    assert "\x1b[" in term.getvalue()  # colour codes on a terminal
    pipe = io.StringIO()
    Console(file=pipe).print(render_row(row))
    assert "\x1b" not in pipe.getvalue()  # a StringIO is not a terminal: plain


def test_json_rows_always_have_the_same_fields() -> None:
    rows = [line(1), start_row(RunStart("j", 0, "n1", 1.0, run_id="R1")),
            decision_row(restart(0))]
    objs = [orjson.loads(orjson.dumps(row_json(r))) for r in rows]
    assert all(tuple(o) == ROW_FIELDS for o in objs)
    assert [o["type"] for o in objs] == ["line", "attempt", "decision"]
    assert objs[2]["decision"]["action"] == "restart" and objs[0]["decision"] is None
