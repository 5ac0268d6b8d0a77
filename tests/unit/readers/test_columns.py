"""Fitting `faultwatch status` into a terminal (readers/columns.py, readers/status.py)."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from faultwatch.readers.columns import Column, abbreviate, fit
from faultwatch.readers.status import table as status_table
from faultwatch.readers.status import visible


def test_abbreviate_at_the_end_or_in_the_middle() -> None:
    assert abbreviate("short", 10) == "short"
    assert abbreviate("abcdefghij", 6) == "abcde…"
    assert abbreviate("train-llama-run7", 9, middle=True) == "trai…run7"
    assert len(abbreviate("x" * 50, 9, middle=True)) == 9


def test_fit_abbreviates_then_drops_the_least_useful_columns() -> None:
    cols = [Column("job", 0, 6, middle=True), Column("phase"), Column("extra", 2),
            Column("more", 1)]
    rows = [["a-very-long-job-name", "running", "xxxxxxxx", "yyyy"]]
    kept, out = fit(cols, rows, 30)
    assert [c.name for c in kept] == ["job", "phase", "more"]  # "extra" (drop 2) went first
    assert out == [["a-very-…ob-name", "running", "yyyy"]]  # room left went to the job
    assert len("  ".join(out[0])) <= 30
    kept, out = fit(cols, rows, 200)  # room: nothing dropped nor cut
    assert out == rows and len(kept) == 4


def test_fit_keeps_the_essential_columns_when_nothing_fits() -> None:
    cols = [Column("job", 0, 6), Column("phase")]
    kept, out = fit(cols, [["jobname-long", "running"]], 5)
    assert [c.name for c in kept] == ["job", "phase"] and out[0][0] == "jobna…"


def snap(job: str, phase: str = "running", ts: float = 1000.0, **kw: Any) -> dict[str, Any]:
    return {"job": job, "run_id": "slurm-12345678-" + job, "attempt": 2, "phase": phase,
            "ts": ts, "nodes_alive": 63, "expected_nodes": 64, "ranks_total": 512,
            "rank_last_output_age_s": [[17, 40.0], [3, 12.0], [5, 1.0]], "window_s": 300.0,
            "window_basis": "learned", "restarts_used": 1, "decisions": ["d" * 40],
            "stages": ["eval"], **kw}


def render(snaps: list[dict[str, Any]], width: int, **kw: Any) -> str:
    c = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    c.print(status_table(snaps, 1005.0, width, **kw))
    return c.export_text()


@pytest.mark.parametrize("width", [80, 100, 60])
def test_status_fits_the_width_and_keeps_what_matters(width: int) -> None:
    long = "train-llama-70b-pretraining-stage2-final-run"
    text = render([snap(long), snap("j2", phase="done")], width)
    lines = text.splitlines()
    assert max(len(x) for x in lines) <= width, text
    assert len(lines) == 4, text  # title, header, one line per job: nothing wrapped
    row = next(x for x in lines if x.startswith("train"))
    assert "…" in row and row.split()[0].endswith("final-run")  # cut in the middle
    assert "running" in row and "63/64" in row
    if width >= 80:
        assert "r17:40s" in row and "5s" in row


def test_wide_shows_every_column_in_full() -> None:
    text = render([snap("j1")], 250, wide=True)
    for cell in ("slurm-12345678-j1", "512", "300s (learned)", "eval", "r17:40s"):
        assert cell in text, (cell, text)


def test_finished_jobs_age_out() -> None:
    snaps = [snap("run1"), snap("set1", phase="settling", ts=0.0),
             snap("done-old", phase="done", ts=1000.0 - 3601), snap("done-new", phase="done"),
             snap("failed-old", phase="decided", ts=-5000.0)]
    shown, hidden = visible(snaps, 1000.0, 3600.0)
    assert [s["job"] for s in shown] == ["done-new", "run1", "set1"] and hidden == 2
    shown, hidden = visible(snaps, 1000.0, 1e9)
    assert len(shown) == 5 and hidden == 0
    assert "(2 finished jobs hidden)" in render([snaps[0]], 80, hidden=2)


def test_in_a_pipe_every_cell_is_whole_one_row_a_line_no_padding() -> None:
    """`faultwatch status | cat` (issue 36 item 6): grep finds a job by its whole name."""
    from faultwatch.readers.status import lines, worker_lines

    long = "train-llama-70b-pretraining-stage2-final-run"
    for wide in (False, True):
        out = lines([snap(long), snap("j2", phase="done")], 1005.0, wide=wide)
        assert len(out) == 4 and out[0].startswith("faultwatch status"), out
        assert [x for x in out if long in x] == [out[2]] and out[2].startswith(long + "  ")
        assert all(x == x.rstrip() for x in out)
        assert len({x.index("phase") if "phase" in x else -1 for x in out[1:2]}) == 1
    assert "slurm-12345678-" + long in lines([snap(long)], 1005.0, wide=True)[2]
    fitted = lines([snap(long)], 1005.0, width=60)  # COLUMNS=60 in a pipe: fitted, as before
    assert max(len(x) for x in fitted) <= 60 and "…" in fitted[2]
    workers = worker_lines([{"worker": "w-1", "group": "fw-processor", "ts": 1000.0,
                             "rules": {"version": "abc", "layers": [
                                 {"layer": "builtin"}, {"layer": "pushed", "push_id": "p7",
                                                        "author": "alice@host"}]}}], 1005.0)
    assert workers[2].split() == ["w-1", "fw-processor", "abc", "builtin+pushed", "p7",
                                  "alice@host", "0", "5s"]
