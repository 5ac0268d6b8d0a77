"""`faultwatch diagnose JOB` (cluster mode): ask a running job's agents for every rank's stack
and Flight Recorder dump, through the same protocol the job stage uses before a hang decision
(a `diagnose` request on the control topic, `diagnosis` notes back on the logs topic), and
print the comparison: per process group the last collective each rank entered and completed,
missing ranks, mismatches, and where each rank is (file:line).

The job's current run, attempt and nodes come from the processors' status snapshots.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from faultwatch.core.events import Decision
from faultwatch.errors import NotFoundError, UsageError

ANSWER_TIMEOUT_S = 30.0  # py-spy on every rank, the first Flight Recorder dump takes 1-2 s


def request(snapshot: Mapping[str, Any], now: float) -> Decision:
    """The `diagnose` notify for the job's current attempt and run (every node answers)."""
    from faultwatch.core.diagnosis import DIAGNOSE_KIND

    return Decision(id=uuid.uuid4().hex[:20], job=str(snapshot["job"]),
                    attempt=int(snapshot["attempt"]), action="notify", kind=DIAGNOSE_KIND,
                    ts=now, message="requested by `faultwatch diagnose`",
                    evidence={"requested_by": "faultwatch diagnose"},
                    run_id=str(snapshot.get("run_id") or ""))


def _check(snapshot: Mapping[str, Any] | None, job: str) -> Mapping[str, Any]:
    if snapshot is None:  # an unknown job: exit 7 as in `status JOB` and `logs JOB`
        raise NotFoundError(f"no processor reports job {job!r} (see `faultwatch status`)")
    if snapshot.get("phase") not in ("running", "settling") or not snapshot.get("nodes_alive"):
        raise UsageError(f"job {job!r} is not running (phase {snapshot.get('phase')}, "
                            f"{snapshot.get('nodes_alive', 0)} node(s) alive)")
    return snapshot


async def ask(bootstrap: str, topics: Any, job: str, timeout_s: float = ANSWER_TIMEOUT_S,
              log: Callable[[str], None] = lambda _m: None
              ) -> tuple[Decision, dict[str, dict[str, Any]], list[str]]:
    """Publish the request, collect the answers. Returns (request, node -> answer as the job
    stage keeps it, nodes that did not answer within timeout_s)."""
    from aiokafka import TopicPartition

    from faultwatch import wire
    from faultwatch.core.diagnosis import DIAGNOSIS_NOTE, fold_answer
    from faultwatch.core.events import Notice
    from faultwatch.core.state import JobState, thaw
    from faultwatch.kafka import clients
    from faultwatch.kafka.errors import diagnose
    from faultwatch.kafka.reading import partitions
    from faultwatch.readers.status import read_snapshots
    from faultwatch.wire import signing

    snap = _check((await read_snapshots(bootstrap, topics.status, job)).get(job), job)
    alive = sorted(str(n["node"]) for n in snap.get("nodes", []) if n.get("alive"))
    consumer = clients.consumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                group_id=None,
                                client_id=f"faultwatch-diagnose-{uuid.uuid4().hex[:6]}")
    producer = clients.producer(bootstrap_servers=bootstrap)
    try:
        await consumer.start()
        await producer.start()
    except Exception as e:
        for c in (consumer, producer):
            try:
                await c.stop()
            except Exception:  # noqa: BLE001, S110 - already failing: report the first error
                pass
        raise await diagnose(e, bootstrap, "asking for a diagnosis") from e
    try:
        parts = await partitions(consumer, topics.logs)
        if not parts:
            raise NotFoundError(f"topic {topics.logs!r} does not exist at {bootstrap}: no agent "
                                "has shipped anything")
        tps = [TopicPartition(topics.logs, p) for p in sorted(parts)]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        for tp in tps:  # fix the positions before the request goes out
            await consumer.position(tp)
        dec = request(snap, time.time())
        from faultwatch.trust.decisions import decision_signer

        value = signing.encode(wire.decision_to_dict(dec), decision_signer())
        await producer.send_and_wait(topics.control, value, key=wire.job_key(job))
        log(f"asked {len(alive)} node(s) of {job} (attempt {dec.attempt}) for stacks "
            f"and Flight Recorder dumps: request {dec.id}")
        st = JobState(job=job)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not set(alive) <= set(st.diagnoses):
            batch = await consumer.getmany(timeout_ms=500)
            for msgs in batch.values():
                for msg in msgs:
                    try:
                        rec = wire.decode_logs(msg.value)
                    except Exception:  # noqa: BLE001, S112 - other records are not ours
                        continue
                    if isinstance(rec, Notice) and rec.job == job and \
                            rec.kind == DIAGNOSIS_NOTE and rec.data.get("request") == dec.id:
                        st = fold_answer(st, rec)
        answers = {n: thaw(a) for n, a in st.diagnoses.items()}
        return dec, answers, [n for n in alive if n not in answers]
    finally:
        await producer.stop()
        await consumer.stop()


def report(answers: Mapping[str, Mapping[str, Any]], missing: list[str]) -> dict[str, Any]:
    """The analysis as a JSON-able dict: the verdict, Flight Recorder groups, rank stacks."""
    from faultwatch.core.diagnosis import verdict

    found = verdict(answers) if answers else None
    out: dict[str, Any] = {"nodes_answered": sorted(answers), "nodes_missing": missing}
    if found is None:
        out["summary"] = "no rank was captured"
        out["errors"] = {n: a.get("errors") for n, a in answers.items()}
        return out
    out.update(summary=found.sentence, culprit_ranks=list(found.culprits),
               culprit_basis=found.basis, checkpoint_ranks=list(found.checkpoint),
               diagnosis=found.evidence)
    return out


def render(rep: Mapping[str, Any]) -> str:
    """The report as text a person reads."""
    lines = [f"nodes answered: {', '.join(rep['nodes_answered']) or 'none'}"]
    if rep["nodes_missing"]:
        lines.append(f"nodes that did not answer: {', '.join(rep['nodes_missing'])}")
    lines.append(f"summary: {rep['summary']}")
    if rep.get("culprit_ranks"):
        lines.append(f"culprit rank(s): {rep['culprit_ranks']} ({rep['culprit_basis']})")
    diag = rep.get("diagnosis") or {}
    fr = diag.get("flight_recorder")
    if fr:
        for g in fr.get("groups", []):
            lines.append(f"process group {g['group'] or '0'!s}: ranks {g['ranks']}, "
                         f"front #{g['front']}, waiting {g['waiting']}, missing {g['missing']}")
            for r, v in g["last"].items():
                lines.append(f"  rank {r}: entered #{v['entered']} completed "
                             f"#{v['completed']} {v['op'] or ''}".rstrip())
            for m in g.get("mismatches", []):
                lines.append(f"  mismatch: {m}")
        for p in fr.get("problems", []):
            lines.append(f"flight recorder: {p}")
    else:
        lines.append("flight recorder: no dumps (the job's ranks did not arm it; "
                     "faultwatch.sdk arms it)")
    for r, a in (diag.get("stacks") or {}).get("ranks", {}).items():
        op = f" {a['op']}" if a.get("op") else ""
        lines.append(f"rank {r}: {a['state']}{op} at {a.get('at')}"
                     + (f" (innermost {a['frames'][0]})" if a.get("frames") else ""))
    for k, v in (diag.get("capture_errors") or {}).items():
        lines.append(f"capture error {k}: {v}")
    return "\n".join(lines)


def run(bootstrap: str, topics: Any, job: str, *, as_json: bool,
        timeout_s: float = ANSWER_TIMEOUT_S) -> int:
    """The CLI command: 0 when every live node answered, 1 when some did not (NotFoundError
    when the job is not known, UsageError when it is not running)."""
    import sys

    import orjson

    _dec, answers, missing = asyncio.run(ask(
        bootstrap, topics, job, timeout_s, log=lambda m: print(m, file=sys.stderr, flush=True)))
    rep = report(answers, missing)
    print(orjson.dumps(rep).decode() if as_json else render(rep), flush=True)
    return 0 if answers and not missing else 1
