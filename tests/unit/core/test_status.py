"""Status snapshots of a job state (pure, time passed in) and their wire record."""

from __future__ import annotations

import pytest

from faultwatch import wire
from faultwatch.core.events import Output, RunStart
from faultwatch.core.job import apply
from faultwatch.core.policy import Policy
from faultwatch.core.state import JobState
from faultwatch.core.status import snapshot
from faultwatch.errors import DecodeError
from faultwatch.readers.status import table


def job_state() -> tuple[object, Policy]:
    policy = Policy(hang_window_s=300.0)
    st = JobState(job="j1")
    for node, rank in (("n1", 0), ("n2", 1)):
        st, _ = apply(st, RunStart("j1", 0, node, 100.0, run_id="slurm-7", world_size=2,
                                   nnodes=2, rank=rank, run_source="slurm",
                                   scheduler={"kind": "slurm", "job_id": "7"}), 100.0, policy)
    st, _ = apply(st, Output("j1", 0, "n1", 150.0, 3, rank_last_ts=((0, 150.0),),
                             run_id="slurm-7"), 150.0, policy)
    st, _ = apply(st, Output("j1", 0, "n2", 120.0, 1, rank_last_ts=((1, 120.0),),
                             run_id="slurm-7"), 150.0, policy)
    return st, policy


def test_a_snapshot_says_who_is_alive_and_who_is_quiet() -> None:
    st, policy = job_state()
    s = snapshot(st, 160.0, policy)  # type: ignore[arg-type]
    assert (s["job"], s["run_id"], s["attempt"], s["phase"]) == ("j1", "slurm-7", 0, "running")
    assert s["scheduler"] == {"kind": "slurm", "job_id": "7"}
    assert (s["nodes_alive"], s["nodes_total"], s["ranks_total"]) == (2, 2, 2)
    assert s["rank_last_output_age_s"] == [[1, 40.0], [0, 10.0]]  # quietest first
    assert (s["window_s"], s["window_basis"]) == (300.0, "fixed")
    assert [n["last_output_age_s"] for n in s["nodes"]] == [10.0, 40.0]


def test_the_snapshot_round_trips_the_wire_and_renders() -> None:
    st, policy = job_state()
    s = snapshot(st, 160.0, policy)  # type: ignore[arg-type]
    back = wire.decode_status(wire.encode_status(s))
    assert back["job"] == "j1" and back["t"] == "status" and back["nodes"] == s["nodes"]
    with pytest.raises(DecodeError, match="status.job"):
        wire.decode_status(wire.encode_status({**s, "job": "bad\nname"}))
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(table([back], 161.0))
    text = console.export_text()
    assert "j1" in text and "slurm-7" in text and "2/2" in text and "r1:40s" in text


def test_status_and_describe_show_holds_and_say_why_the_window() -> None:
    """Issue 36 item 5: a held or muted job says so in `status` (`running,held`, as kubectl
    shows `Ready,SchedulingDisabled`) and in `describe`, beside the window and why."""
    from rich.console import Console

    from faultwatch.core.holds import HOLD, MUTE, new_hold
    from faultwatch.readers.describe import lines
    from faultwatch.readers.status import with_holds

    st, policy = job_state()
    s = wire.decode_status(wire.encode_status(snapshot(st, 160.0, policy)))  # type: ignore[arg-type]
    assert s["window_why"] == "fixed"
    hold = new_hold(HOLD, "j1", 150.0, 3600, "debugging", "alice@ops", "h1")
    mute = new_hold(MUTE, "other", 150.0, 3600, "noisy", "bob", "m1")
    snaps = with_holds({"j1": s, "j2": {**s, "job": "j2"}}, [hold, mute])
    assert [h["kind"] for h in snaps["j1"].get("holds", [])] == ["hold"]
    assert "holds" not in snaps["j2"]
    console = Console(width=200, record=True)
    console.print(table(snaps.values(), 161.0))
    rows = console.export_text().splitlines()
    assert "running,held" in next(r for r in rows if r.startswith("j1"))
    assert "running " in next(r for r in rows if r.startswith("j2"))  # positive control
    view = {"job": "j1", "now": 161.0, "status": snaps["j1"],
            "holds": [{**hold.to_dict(), "in_force": True}],
            "runs": [{"run_id": "slurm-7", "attempt": 0, "first_ts": None, "decisions": [],
                      "current": True}],
            "decisions_total": 0, "decisions": [], "refusals": [], "diagnosis_requests": 0}
    text = "\n".join(lines(view))
    assert "Holds:          hold: held by alice@ops for 59m49s more" in text
    assert "Window:         300s (fixed)" in text
    assert "r1:40s  r0:10s" in text and "run slurm-7  attempt 0  (current)" in text
    assert "scheduler kind=slurm job_id=7" in text


def test_ages_and_quiet_times_read_as_kubectl_prints_them() -> None:
    """A job quiet for 3h12m and last reported 2 days ago reads `r1:3h12m` and `2d`, not
    `11520s` and `172800s`."""
    from faultwatch.readers.status import lines

    st, policy = job_state()
    s = snapshot(st, 120.0 + 11_520.0, policy)  # type: ignore[arg-type]
    text = "\n".join(lines([s], s["ts"] + 2 * 86_400.0, width=200))
    assert "r1:3h12m" in text and " 2d" in text, text
    assert "11520s" not in text and "172800s" not in text, text
