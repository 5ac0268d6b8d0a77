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
