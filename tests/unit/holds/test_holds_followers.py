"""Who honours an operator's hold or mute (issue 36 item 5): the job stage publishes a held
job's restart as a notice and keeps its budget; the followers' table takes only operator-signed
records and no replay of an old one; notify's intake posts nothing about a muted job. Each
with the unheld job beside it as the positive control."""

from __future__ import annotations

import functools
from collections import namedtuple
from typing import Any

import orjson
import pytest

from faultwatch import wire
from faultwatch.core.events import Decision, Exit, Line, RunStart
from faultwatch.core.holds import HOLD, MUTE, Hold, new_hold, released
from faultwatch.core.policy import Policy
from faultwatch.core.state import JobState
from faultwatch.holds.table import HoldsTable
from faultwatch.streams.local import LocalPipeline
from faultwatch.trust.records import HOLD as PURPOSE
from faultwatch.trust.records import RecordGate, RecordSigner, verifier_for
from faultwatch.wire.holds import encode_hold, hold_dict, hold_key
from tests.support.rules import builtin_ruleset
from tests.unit.trust.helpers import make_key, trust_of

T0 = 1_700_000_000.0
NCCL = "RuntimeError: NCCL error in: socket.cpp:1, unhandled system error, NCCL version 2.18.1"


@functools.cache
def ruleset() -> Any:
    return builtin_ruleset()


def crash(pipe: LocalPipeline, job: str, t: float) -> list[Decision]:
    decs: list[Decision] = []
    for v in (wire.encode_run_start(RunStart(job, 0, "n0", t, run_id="r")),
              wire.encode_lines(job, 0, "n0", "r", [Line("stderr", 0, t, NCCL)]),
              wire.encode_exit(Exit(job, 0, "n0", t + 0.1, exit_code=1, run_id="r"))):
        decs += pipe.submit(wire.log_key(job, "n0"), v, t + 0.2)
    return decs + pipe.tick(t + 2.0)


def test_the_job_stage_publishes_a_held_jobs_restart_as_a_notice() -> None:
    pipe = LocalPipeline(ruleset(), Policy(settle_s=0.5))
    hold = new_hold(HOLD, "held", T0, 3600, "debugging", "alice@ops", "h1")
    pipe.jobs.holds = lambda job, now: hold if job == "held" and hold.in_force(now) else None
    control = crash(pipe, "free", T0)
    assert [(d.action, d.kind) for d in control] == [("restart", "error")]  # positive control
    held = crash(pipe, "held", T0)
    assert [(d.action, d.kind) for d in held] == [("notify", "error")]
    assert held[0].evidence["held"]["action"] == "restart"
    assert held[0].evidence["held"]["by"] == "alice@ops"
    def stored(job: bytes) -> JobState:  # (a state is stored with its non-default fields)
        return JobState.from_dict(orjson.loads(pipe.store.get(job) or b"{}"))

    assert stored(b"held").restarts_used == 0
    assert stored(b"free").restarts_used == 1


TP = namedtuple("TP", "topic partition")


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("keys")
    ops, ops_line = make_key(tmp, "operator", "ops")
    proc, proc_line = make_key(tmp, "processor", "p")
    return {"ops": ops, "proc": proc, "trust": trust_of(ops_line, proc_line)}


def signed(h: Hold, key: Any) -> bytes:
    rec = hold_dict(h)
    return encode_hold(RecordSigner(key, PURPOSE).sign_record(rec) if key else rec)


def table(keys: dict[str, Any], logged: list[str]) -> HoldsTable:
    def log(event: str, **_f: Any) -> None:
        logged.append(event)
    return HoldsTable(RecordGate("hold", verifier_for(PURPOSE, keys["trust"]), log), log)


def test_the_table_takes_only_operator_signed_holds_and_no_replay(keys: dict[str, Any]
                                                                  ) -> None:
    logged: list[str] = []
    t = table(keys, logged)
    h = new_hold(HOLD, "j", T0, 3600, "debugging", "alice", "h1")
    assert t.observe(hold_key(HOLD, "j"), signed(h, None)) is None  # unsigned
    assert t.observe(hold_key(HOLD, "j"), signed(h, keys["proc"])) is None  # wrong role
    assert t.hold_of("j", T0 + 1) is None and logged == ["hold_refused", "hold_refused"]
    assert t.observe(hold_key(HOLD, "j"), signed(h, keys["ops"])) == h  # positive control
    assert t.hold_of("j", T0 + 1) == h and t.muted("j", T0 + 1) is None
    assert t.observe(hold_key(MUTE, "j"), signed(h, keys["ops"])) is None  # key names a mute
    end = released(h, T0 + 600, "bob")
    assert t.observe(hold_key(HOLD, "j"), signed(end, keys["ops"])) == end
    assert t.hold_of("j", T0 + 601) is None
    # the old hold written again after its release: refused, the release stays
    assert t.observe(hold_key(HOLD, "j"), signed(h, keys["ops"])) is None
    assert t.hold_of("j", T0 + 601) is None and logged[-1] == "hold_refused"
    assert t.hold_of("j", T0 + 3601) is None  # and a hold ends by itself
    assert t.observe(hold_key(HOLD, "j"), None) is None  # a tombstone is unsigned
    assert t.holds[(HOLD, "j")] == end


def test_a_hold_replayed_seconds_after_its_release_is_refused_by_version(
        keys: dict[str, Any]) -> None:
    """Records are ordered by the version their writer sets (seq, then time), not by a clock
    allowance: the old hold written again 5 s after its release (inside any allowance for
    skewed clocks) is refused; a new hold built on the release (seq + 1) is taken even when
    the operator's clock runs behind the releaser's."""
    logged: list[str] = []
    t = table(keys, logged)
    h = new_hold(HOLD, "j", T0, 3600, "debugging", "alice", "h1")
    assert t.observe(hold_key(HOLD, "j"), signed(h, keys["ops"])) == h
    end = released(h, T0 + 5, "bob")
    assert end.seq == h.seq + 1
    assert t.observe(hold_key(HOLD, "j"), signed(end, keys["ops"])) == end
    assert t.observe(hold_key(HOLD, "j"), signed(h, keys["ops"])) is None  # the replay
    assert logged[-1] == "hold_refused" and t.hold_of("j", T0 + 6) is None
    again = new_hold(HOLD, "j", T0 + 2, 3600, "again", "carol", "h2", last=end)  # clock behind
    assert again.seq == end.seq + 1
    assert t.observe(hold_key(HOLD, "j"), signed(again, keys["ops"])) == again
    assert t.hold_of("j", T0 + 6) == again


def test_the_table_is_bounded(keys: dict[str, Any]) -> None:
    logged: list[str] = []
    t = HoldsTable(None, lambda e, **f: logged.append(e), max_holds=2)
    for i, at in enumerate((T0 - 10_000, T0, T0)):  # the first has ended by T0
        t.observe(None, signed(new_hold(HOLD, f"j{i}", at, 3600, "r", "a", f"h{i}"), None),
                  now=T0)
    assert sorted(job for _, job in t.holds) == ["j1", "j2"]  # the ended one made room
    t.observe(None, signed(new_hold(MUTE, "j3", T0, 3600, "r", "a", "m"), None), now=T0)
    assert (MUTE, "j3") not in t.holds and logged == ["holds_full"]


def test_notify_posts_nothing_about_a_muted_job(keys: dict[str, Any]) -> None:
    """The intake asks before any sink: no webhook message and no Alertmanager alert."""
    from faultwatch.notify.alertmanager import Alertmanager
    from faultwatch.notify.grouping import GroupingPolicy
    from faultwatch.notify.sender import Receiver
    from faultwatch.notify.service import Notifier, NotifierConfig
    from faultwatch.trust.records import DecisionGate

    logged: list[tuple[str, dict[str, Any]]] = []
    holds = HoldsTable()
    holds.observe(None, signed(new_hold(MUTE, "noisy", T0, 3600, "known", "bob", "m1"), None))
    tp = TP("p.decisions", 0)
    n = Notifier(NotifierConfig("b:1", tp.topic, (Receiver("http://h/x"),),
                                policy=GroupingPolicy(group_wait_s=0),
                                alertmanagers=(Alertmanager("http://am:9093"),)),
                 DecisionGate(None, lambda e, **f: None),
                 lambda e, **f: logged.append((e, f)), clock=lambda: T0 + 10, holds=holds)
    for i, job in enumerate(("noisy", "quiet", "noisy")):
        d = Decision(id=f"d{i}", job=job, attempt=0, action="restart", kind="error",
                     ts=T0 + 10, message="NCCL error", run_id="r")
        n.take(orjson.dumps(wire.decision_to_dict(d)), tp, i)
    assert n.committable({tp: 3}) == {tp: 1}  # only the quiet one waits for its message
    sent = n.grouper.due(T0 + 10)
    assert [[d["job"] for d in note.decisions] for note in sent] == [["quiet"]]
    assert [e for e, _ in logged] == ["notify_muted"] and logged[0][1]["by"] == "bob"
    assert n.book is not None and {a.job for a in n.book.alerts.values()} == {"quiet"}


