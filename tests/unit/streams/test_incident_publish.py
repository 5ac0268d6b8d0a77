"""Run ledgers through the job stage to the incidents topic (streams/incident_publish.py):
what is published when, the goodput metrics board, a reused name, 10,000 jobs bounded."""

from __future__ import annotations

import functools
from typing import Any

import orjson
import pytest

from faultwatch import wire
from faultwatch.core.events import Exit, Progress, RunStart, Stage
from faultwatch.core.policy import Policy
from faultwatch.rules import Matcher, load_ruleset
from faultwatch.streams import incident_publish
from faultwatch.streams.incident_publish import IncidentPublisher
from faultwatch.streams.job_stage import DictStore, JobStage
from faultwatch.streams.records import InRecord, LiveRules
from faultwatch.wire.incidents import decode_ledger, incident_key

T0 = 1_700_000_000.0
POLICY = Policy(settle_s=0.0, node_lost_s=600.0, fault_tolerant_policy="on_failure")


@functools.cache
def ruleset() -> Any:
    return load_ruleset(())


def stage() -> JobStage:
    rs = ruleset()

    def dead(rec: InRecord, err: Exception) -> None:
        raise AssertionError(f"dead letter at offset {rec.offset}: {err}")

    return JobStage(LiveRules(Matcher(rs), POLICY, rs.version), DictStore(), dead)


def feed(js: JobStage, now: float, *sigs: Any) -> list[Any]:
    recs = [InRecord("t.signals", 0, k, s.job.encode(), wire.encode_bundle(s.job, [s]))
            for k, s in enumerate(sigs)]
    recs.append(InRecord("t.signals", 0, 0, None, wire.encode_tick(now)))
    return js.process_batch(recs, now)


def published(pub: IncidentPublisher, js: JobStage, now: float) -> list[dict[str, Any]]:
    out = pub.due(list(js.parts.values()), js.retired_ledgers, now)
    recs = [decode_ledger(v)[0] for _, v in out]
    assert [k for k, _ in out] == [incident_key(r["job"], r["run_id"]) for r in recs]
    return recs


def crash(js: JobStage, job: str, run: str = "r") -> None:
    """A run: steps, a checkpoint at step 3, a crash, the restart, steps, done."""
    feed(js, T0, RunStart(job, 0, "n0", T0, run_id=run))
    feed(js, T0 + 4, *[Progress(job, 0, "n0", T0 + k, 0, k, run_id=run) for k in (1, 2, 3)],
         Stage(job, 0, "n0", T0 + 3.5, 0, "checkpoint", True, step=3, run_id=run),
         Stage(job, 0, "n0", T0 + 4, 0, "checkpoint", False, step=3, run_id=run),
         Progress(job, 0, "n0", T0 + 5, 0, 4, run_id=run))
    decs = feed(js, T0 + 7, Exit(job, 0, "n0", T0 + 6, 1, run_id=run))
    assert [d.action for d in decs] == ["restart"], decs
    feed(js, T0 + 8, RunStart(job, 1, "n0", T0 + 8, run_id=run),
         Progress(job, 1, "n0", T0 + 9, 0, 4, run_id=run),
         Progress(job, 1, "n0", T0 + 10, 0, 5, run_id=run),
         Exit(job, 1, "n0", T0 + 11, 0, run_id=run))


def test_a_run_is_published_when_it_changes_and_refreshed_while_active() -> None:
    js, pub = stage(), IncidentPublisher(refresh_s=60.0, max_per_s=1.0, call_s=3.0)
    feed(js, T0, RunStart("a", 0, "n0", T0, run_id="r"))
    (first,) = published(pub, js, T0)
    assert first["ledger"]["attempts"][0]["n"] == 0 and first["account"]["ratio"] is None
    feed(js, T0 + 1, Progress("a", 0, "n0", T0 + 1, 0, 1, run_id="r"))
    assert [r["ledger"]["rev"] for r in published(pub, js, T0 + 1)] == [2]  # first step
    feed(js, T0 + 2, Progress("a", 0, "n0", T0 + 2, 0, 2, run_id="r"))
    assert published(pub, js, T0 + 2) == []  # a step alone changes nothing a reader acts on
    (again,) = published(pub, js, T0 + 62)  # ... until the refresh
    assert again["ledger"]["attempts"][0]["last_step"] == 2


def test_the_incident_its_recovery_and_the_metrics_board() -> None:
    js, pub = stage(), IncidentPublisher()
    crash(js, "a")
    (rec,) = published(pub, js, T0 + 12)
    (i,) = rec["ledger"]["incidents"]
    assert (i["cause"], i["lost_steps"], i["recovered_ts"]) == ("error", 1, T0 + 9)
    acc = rec["account"]
    assert acc["wall_s"] == 11.0 and acc["productive_s"] == pytest.approx(3.5)
    b = pub.board
    assert b.ratios == {"a": pytest.approx(3.5 / 11, abs=1e-4)}
    assert b.seconds["productive"] == pytest.approx(3.5)
    assert b.recovery_count == 1 and b.recovery_sum == pytest.approx(9 - 6)
    assert published(pub, js, T0 + 100) == []  # done: never refreshed, counted once
    assert b.seconds["productive"] == pytest.approx(3.5) and b.recovery_count == 1


def test_a_reused_name_publishes_the_old_runs_last_ledger_and_a_new_account() -> None:
    js, pub = stage(), IncidentPublisher()
    crash(js, "a", run="old")
    published(pub, js, T0 + 12)
    feed(js, T0 + 20, RunStart("a", 0, "n0", T0 + 20, run_id="new", run_source="slurm"))
    recs = published(pub, js, T0 + 21)
    assert [(r["run_id"], r["final"]) for r in recs] == [("old", True), ("new", False)]
    assert recs[1]["ledger"]["first_ts"] == T0 + 20 and "incidents" not in recs[1]["ledger"]
    assert len(js.retired_ledgers) == 0


@pytest.mark.slow  # 12-35 s on 2 cores
def test_ten_thousand_jobs_keep_bounded_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each job starts, steps, checkpoints and fails; what the stage stores per job, what the
    publisher holds and the metric series stay bounded (the job stage's own cap bounds the
    number of states: MAX_JOBS)."""
    monkeypatch.setattr(incident_publish, "MAX_JOB_SERIES", 500)
    js, pub = stage(), IncidentPublisher(max_per_s=100.0)
    jobs = [f"job-{k:05d}" for k in range(10_000)]
    for lo in range(0, len(jobs), 500):
        chunk = jobs[lo:lo + 500]
        feed(js, T0, *[RunStart(j, 0, "n0", T0, run_id="r") for j in chunk])
        feed(js, T0 + 5, *[s for j in chunk for s in (
            Progress(j, 0, "n0", T0 + 1, 0, 1, run_id="r"),
            Stage(j, 0, "n0", T0 + 2, 0, "checkpoint", True, step=1, run_id="r"),
            Stage(j, 0, "n0", T0 + 3, 0, "checkpoint", False, step=1, run_id="r"),
            Progress(j, 0, "n0", T0 + 4, 0, 2, run_id="r"))])
        feed(js, T0 + 6, *[Exit(j, 0, "n0", T0 + 5, 1, run_id="r") for j in chunk])
        pub.due(list(js.parts.values()), js.retired_ledgers, T0 + 7)
    stored = [len(v) for v in js.store.data.values()]  # type: ignore[attr-defined]
    ledgers = [len(orjson.dumps(orjson.loads(v)["ledger"])) for v in
               list(js.store.data.values())[:100]]  # type: ignore[attr-defined]
    print(f"\n10,000 jobs: stored {sum(stored) / len(stored):.0f} B/job (ledger "
          f"{sum(ledgers) / len(ledgers):.0f} B), publisher holds {len(pub.seen)}")
    assert len(stored) == 10_000 and max(ledgers) < 1500
    assert len(pub.board.ratios) == 500  # the metric's series are capped
    assert len(pub.seen) <= 10_000
