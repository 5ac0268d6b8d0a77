"""JobState as data: one field table drives persistence, no mutable value inside it, Phase
is a str."""

from __future__ import annotations

import dataclasses

import orjson

from faultwatch.core.events import (
    Decision,
    Exit,
    Heartbeat,
    Hit,
    Match,
    Output,
    Progress,
    RunStart,
    Signal,
    Stage,
)
from faultwatch.core.folds import new_attempt
from faultwatch.core.job import apply
from faultwatch.core.ledger import Ledger
from faultwatch.core.pmap import PMap
from faultwatch.core.policy import Policy
from faultwatch.core.state import JobState, Phase, Spare, freeze
from faultwatch.core.windows import GapHist

P = Policy(settle_s=0, max_restarts=3, skew_warn_s=1)


def busy_state() -> JobState:
    """A state with every field away from its default."""
    st = JobState(job="j")
    sigs = [RunStart("j", 2, "a", 1.0, run_id="r", world_size=2, nnodes=3, rank=0,
                     run_source="slurm", scheduler={"kind": "slurm", "labels": {"t": ["x"]}}),
            RunStart("j", 2, "b", 9.0, run_id="r", world_size=2, rank=1),
            Output("j", 2, "a", 10.0, 1, rank_last_ts=((0, 10.0),)),
            Progress("j", 2, "a", 11.0, 0, 5, step_time_s=0.5),
            Progress("j", 2, "a", 12.0, 1, 6, step_time_s=0.9),
            Stage("j", 2, "a", 13.0, 0, "eval", True, 30.0),
            Heartbeat("j", 2, "a", 14.0, True, 10.0),
            Hit("j", 2, "a", Match("r1", "retryable", False, 15.0, "boom", 0, context=("x",))),
            Exit("j", 2, "a", 16.0, 1)]
    for i, s in enumerate(sigs):
        st, _ = apply(st, s, 10.0 + i, P)
    return dataclasses.replace(
        st, same_error=st.same_error.set("k", 2), hists=PMap({"": GapHist().add(1.0)}),
        retryable=("oom",), blacklist=PMap({"a": (1, 99.0)}), short_fails=PMap({"a": 1}),
        slow_nodes=PMap({"b": 2}), flags=frozenset({"skew"}), slow_check_ts=3.0, notified=1,
        failure_seen_at=16.0, stage_ts=13.0, phase=Phase.DECIDED, restarts_used=1,
        decided=("d1",), restart_times=(5.0,), steps=4, retired=("r0",),
        dropped=PMap({"unknown-run": 1}), failed=True, diag_for=20.0, diag_asked=19.0,
        diag_sent=(("d1", 19.0, 20.0),), losses=(2.5, 2.25),
        diagnoses=freeze({"a": {"ts": 18.0, "ranks": {"0": {"stack": {"state": "collective"},
                                                              "fr": None}}}}),
        hang_culprits=PMap({"b": 1}), pending_gaps=(("", 1.5, 2.0),), outputs_since_step=2,
        allocation=frozenset({"a", "b"}), run_gen=1,
        spares=PMap({"c": Spare("c", 1.0, 2.0, 3.0, "failed", ("disk",), "suspect", "j2",
                                "taken", "a", 2)}), rdzv_hosts=frozenset({"a"}),
        ledger=_ledger(sigs))


def _ledger(sigs: list[Signal]) -> Ledger:
    """The run's ledger (of the same signals) with every field away from its default too."""
    from faultwatch.core.ledger import Checkpoint
    from faultwatch.core.timeline import observe

    led = observe(Ledger(), [*sigs, Stage("j", 2, "a", 13.5, 0, "eval", False)],
                  [Decision("d1", "j", 2, "restart", "error", 17.0,
                            evidence={"first_error": {"ts": 15.0, "node": "a"}})])
    return dataclasses.replace(led, ckpt=Checkpoint(4, 12.5, 2), stride=2, skipped=1,
                               earlier=(("productive", 3.0),), earlier_attempts=1,
                               incidents_dropped=1)


def test_every_field_round_trips_through_json() -> None:
    st = busy_state()
    defaults = JobState(job="j")
    for f in dataclasses.fields(JobState):
        if f.name not in ("job", "tail"):
            assert getattr(st, f.name) != getattr(defaults, f.name), f.name
    again = JobState.from_dict(orjson.loads(orjson.dumps(st.to_dict())))
    assert again == st
    assert isinstance(again.phase, Phase)
    assert again.scheduler["labels"]["t"] == ("x",)  # frozen all the way down


def test_an_older_state_without_newer_fields_loads_with_defaults() -> None:
    d = busy_state().to_dict()
    for k in ("hists", "slow_nodes", "stage_ts", "flags"):
        del d[k]
    d["_p"] = 3  # the Faust shell's partition tag is ignored
    st = JobState.from_dict(d)
    assert st.hists == PMap() and st.stage_ts is None and st.flags == frozenset()


def test_no_mutable_container_inside_a_state() -> None:
    def walk(x: object, path: str) -> None:
        assert not isinstance(x, dict | list | set), f"{path} is a mutable {type(x).__name__}"
        if isinstance(x, tuple | frozenset):
            for i, y in enumerate(x):
                walk(y, f"{path}[{i}]")
        elif isinstance(x, PMap):
            for k, v in x.items():
                walk(v, f"{path}[{k!r}]")
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            for f in dataclasses.fields(x):
                walk(getattr(x, f.name), f"{path}.{f.name}")

    walk(busy_state(), "state")


def test_phase_is_a_str_and_a_new_attempt_resets_attempt_fields_only() -> None:
    st = busy_state()
    assert st.phase == "decided" == Phase.DECIDED and f"{st.phase}" == "decided"
    nxt = new_attempt(st, 1)
    assert (nxt.attempt, nxt.phase, len(nxt.nodes), nxt.hits, nxt.flags) == \
        (1, Phase.RUNNING, 0, (), frozenset())
    assert (nxt.restarts_used, nxt.blacklist, nxt.decided) == \
        (st.restarts_used, st.blacklist, st.decided)
