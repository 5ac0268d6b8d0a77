"""The readable decision block: what a person reads once per decision."""

from __future__ import annotations

from faultwatch.core.events import Decision
from faultwatch.readers.render import render_decision


def test_a_last_line_with_torchruns_rank_prefix_does_not_say_the_rank_twice() -> None:
    d = Decision(id="d1", job="j", attempt=0, action="restart", kind="hang", ts=1.0,
                 nodes=("n1",), message="every rank silent",
                 evidence={"last_lines": {"0": ["[rank0]:step 2 loss 0.33"],
                                          "1": ["[rank0]:a line that names another rank"],
                                          "2": ["plain"]}})
    lines = render_decision(d).split("\n")
    assert "  last line of rank 0: step 2 loss 0.33" in lines
    assert "  last line of rank 1: [rank0]:a line that names another rank" in lines
    assert "  last line of rank 2: plain" in lines


def test_a_reader_shows_when_a_decision_was_made_and_its_age_as_kubectl() -> None:
    from faultwatch.readers.render import age

    d = Decision(id="d2", job="j", attempt=0, action="fail", kind="exit", ts=1_800_000_000.0,
                 nodes=("n1",), message="n1 exited with code 1, no rule matched")
    head = render_decision(d, now=1_800_000_000.0 + 192).split("\n")[0]
    assert head.endswith(" id=d2 time=2027-01-15T08:00:00Z age=3m12s"), head
    assert "time=" not in render_decision(d)  # the run's own block: happening now
    assert [age(s) for s in (5, 119, 120, 600, 2520, 18720, 72000, 273600, 2592000)] == [
        "5s", "119s", "2m", "10m", "42m", "5h12m", "20h", "3d4h", "30d"]
