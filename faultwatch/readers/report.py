"""`faultwatch report`: a job's incidents and goodput, or the fleet's, from the run ledgers
(the incidents topic, or embedded runs' --incidents-out files) and the actuators' records of
what they did (the acted topic)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from faultwatch.core.goodput import LABELS, PARTS, Account, account, fleet, fmt_s
from faultwatch.core.incidents import lost_phrase
from faultwatch.core.ledger import Ledger
from faultwatch.core.lemons import LemonWatch, blames
from faultwatch.core.policy import Policy
from faultwatch.errors import DecodeError, NotFoundError
from faultwatch.eventlog import clean, log_event
from faultwatch.wire.incidents import decode_acted, decode_ledger

Run = tuple[dict[str, Any], Ledger]  # (the record's fields, its ledger)
Runs = dict[tuple[str, str], Run]  # (job, run id) -> its latest record


def _newer(a: Run, b: Run) -> bool:
    """Whether record `a` is newer than `b` (the ledger's revision, then publication)."""
    return (a[1].rev, float(a[0].get("ts", 0.0))) >= (b[1].rev, float(b[0].get("ts", 0.0)))


def keep_latest(runs: Runs, rec: dict[str, Any], led: Ledger) -> None:
    key = (led.job, led.run_id)
    old = runs.get(key)
    if old is None or _newer((rec, led), old):
        runs[key] = (rec, led)


def read_files(paths: Iterable[str]) -> Runs:
    """The latest ledger of each run in --incidents-out files; a bad line is reported with
    its file:line and skipped."""
    runs: Runs = {}
    for path in paths:
        try:
            lines = Path(path).read_bytes().splitlines()
        except OSError as e:
            raise NotFoundError(f"{path}: {e.strerror or e}") from None
        for n, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            try:
                rec, led = decode_ledger(raw)
            except DecodeError as e:
                log_event("undecodable_record", where=f"{path}:{n}", error=str(e)[:300])
                continue
            keep_latest(runs, rec, led)
    return runs


async def read_topics(bootstrap: str, incidents: str, acted: str | None, gate: Any = None
                      ) -> tuple[Runs, dict[str, list[dict[str, Any]]]]:
    """The latest ledger of each run on the incidents topic (signed ones only, with a trust
    file: `gate`), and the acted records by decision id."""
    from faultwatch.kafka.reading import read_topic, report_bad_record

    runs: Runs = {}
    async for msg, value in read_topic(bootstrap, incidents, decoder=lambda v: v,
                                       must_exist=True):
        where = f"{msg.topic}[{msg.partition}]@{msg.offset}"
        if gate is not None and not gate.admit_value(value, where=where):
            continue
        try:
            rec, led = decode_ledger(value)
        except DecodeError as e:
            report_bad_record(msg, e)
            continue
        keep_latest(runs, rec, led)
    done: dict[str, list[dict[str, Any]]] = {}
    if acted is not None:
        async for _msg, d in read_topic(bootstrap, acted, decoder=decode_acted):
            done.setdefault(str(d["decision"]), []).append(d)
    return runs, done


def load(bootstrap: str | None, topics: Any, files: list[str]
         ) -> tuple[Runs, dict[str, list[dict[str, Any]]]]:
    """Runs and acted records from files (no Kafka) or the topics."""
    if files:
        return read_files(files), {}
    assert bootstrap is not None
    from faultwatch.kafka.errors import BROKER_ERRORS, broker_error
    from faultwatch.trust.keys import load_trust
    from faultwatch.trust.records import LEDGER, RecordGate, verifier_for

    gate = RecordGate("ledger", verifier_for(LEDGER, load_trust()), log_event)
    try:
        return asyncio.run(read_topics(bootstrap, topics.incidents, topics.acted, gate))
    except BROKER_ERRORS as e:
        raise broker_error(e, bootstrap, f"reading {topics.incidents}") from None


def pick(runs: Runs, job: str, run_id: str | None = None) -> Run:
    """The job's run (`run_id`, else its latest); NotFoundError when there is none."""
    mine = [r for (j, rid), r in runs.items() if j == job and (run_id is None or rid == run_id)]
    if not mine:
        what = f"job {job!r}" + (f" run {run_id!r}" if run_id else "")
        raise NotFoundError(f"no ledger of {what} (a wrong --topic-prefix or file? the "
                            "processor publishes a run's ledger once it started)")
    return max(mine, key=lambda r: (r[1].first_ts or 0.0, r[1].rev))


def lemon_watch(runs: Runs, policy: Policy, now: float) -> LemonWatch:
    """The lemon watch over every run's incidents (the processors' rule, docs/goodput.md)."""
    w = LemonWatch(min_jobs=policy.lemon_min_jobs, window_s=policy.lemon_window_s)
    found = [b for _rec, led in runs.values() for i in led.incidents
             for b in blames(led.job, led.run_id, i.to_dict())]
    w.observe(sorted(found, key=lambda b: b.ts), now, emit=False)
    return w


def _span(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(b - a, 3)


def job_report(run: Run, acted: Mapping[str, list[dict[str, Any]]], lemons: LemonWatch,
               now: float) -> dict[str, Any]:
    """What `report JOB --json` prints (and the text and HTML views show)."""
    rec, led = run
    acc = account(led)
    incidents = []
    for i in led.incidents:
        d = i.to_dict()
        d["lost"] = lost_phrase(i)
        d["detect_s"] = _span(i.first_sign_ts, i.detected_ts)
        d["recover_s"] = _span(i.first_sign_ts, i.recovered_ts)
        d["actuated"] = [{k: a[k] for k in ("node", "action", "backend", "result", "ts")}
                         for a in acted.get(i.id, [])]
        incidents.append(d)
    bad = set(lemons.lemons(now))
    attempts = [{"attempt": a.n, "launch_ts": a.launch_ts, "first_step_ts": a.first_step_ts,
                 "last_step_ts": a.last_step_ts, "end_ts": a.end_ts, "nodes": a.node_count,
                 "first_step": a.first_step, "top_step": a.top_step,
                 "spans": [list(s) for s in a.all_spans(acc.end_ts or a.launch_ts)]}
                for a in led.attempts]
    return {"job": led.job, "run_id": led.run_id, "final": bool(rec.get("final")),
            "published_ts": rec.get("ts"), "attempts": attempts,
            "earlier_attempts": led.earlier_attempts, "incidents": incidents,
            "incidents_dropped": led.incidents_dropped, "account": acc.to_dict(),
            "goodput": acc.line(), "nodes": list(led.nodes), "node_total": led.node_total,
            "lemons": [{"node": n, "blames": [b.to_dict() for b in lemons.nodes.get(n, [])]}
                       for n in led.nodes if n in bad],
            "samples": [list(s) for s in led.samples]}


def _when(ts: float | None, t0: float | None) -> str:
    if ts is None:
        return "-"
    clock = time.strftime("%H:%M:%S", time.localtime(ts))
    return clock if t0 is None else f"{clock} (+{fmt_s(max(0.0, ts - t0))})"


def render_job(rep: Mapping[str, Any]) -> str:
    """The terminal summary: goodput, its breakdown, the incident table, lemon nodes."""
    acc = rep["account"]
    t0 = acc.get("start_ts")
    out = [clean(f"job {rep['job']}  run {rep['run_id'] or '-'}  "
                 f"{len(rep['attempts']) + rep['earlier_attempts']} attempt(s), "
                 f"{len(rep['incidents']) + rep['incidents_dropped']} incident(s)"),
           clean(rep["goodput"]), ""]
    wall = acc["wall_s"] or 0.0
    rows = [("productive", acc["productive_s"])] + [(LABELS[k], acc["badput_s"][k])
                                                    for k in PARTS]
    out.append(f"  {'time':<14} {'seconds':>10} {'share':>7}")
    for name, v in rows:
        if v or name == "productive":
            share = f"{100 * v / wall:6.1f}%" if wall else "     -"
            out.append(f"  {name:<14} {v:>10.1f} {share}")
    if acc.get("clamped"):
        out.append(f"  ({acc['clamped']} point(s) out of order clamped: clocks of the nodes "
                   "disagree)")
    if rep["incidents"]:
        out += ["", f"  {'#':>2} {'first sign':<20} {'att':>3} {'cause':<13} {'rule':<28} "
                    f"{'blamed':<16} {'detect':>7} {'recover':>8}  lost"]
        for n, i in enumerate(rep["incidents"], 1):
            rule = i["rule"] or i["kind"] or "-"
            out.append(clean(
                f"  {n:>2} {_when(i['first_sign_ts'], t0):<20} {i['attempt']:>3} "
                f"{i['cause']:<13} {rule[:28]:<28} {','.join(i['nodes'])[:16] or '-':<16} "
                f"{_dur(i['detect_s']):>7} {_dur(i['recover_s']):>8}  {i['lost']}"))
            for a in i["actuated"]:
                out.append(clean(f"     {a['backend']} {a['action']} {a['node']} at "
                                 f"{_when(a['ts'], t0)}: {a['result']}"))
    if rep["lemons"]:
        out += ["", "  lemon nodes among the job's nodes (blamed in incidents of several jobs):"]
        for lem in rep["lemons"]:
            jobs = sorted({b["job"] for b in lem["blames"]})
            out.append(clean(f"    {lem['node']}: {len(jobs)} jobs ({', '.join(jobs[:6])})"))
    return "\n".join(out)


def _dur(s: float | None) -> str:
    return "-" if s is None else fmt_s(max(0.0, s))


def fleet_report(runs: Runs, since: float | None, lemons: LemonWatch, now: float
                 ) -> dict[str, Any]:
    """What `report --fleet --json` prints: fleet figures, lemon nodes, the runs with the
    most badput."""
    chosen = [led for _rec, led in runs.values()
              if since is None or (led.last_ts or 0.0) >= since]
    rep = fleet(chosen, since)
    accs: list[tuple[Account, Ledger]] = [(account(led), led) for led in chosen]
    worst = sorted(accs, key=lambda x: x[0].productive_s - x[0].wall_s)[:10]
    rep["worst"] = [{"job": led.job, "run_id": led.run_id, "goodput": acc.line(),
                     "badput_s": round(acc.wall_s - acc.productive_s, 3)} for acc, led in worst]
    rep["lemons"] = [{"node": n, "jobs": sorted({b.job for b in lemons.nodes.get(n, [])})}
                     for n in lemons.lemons(now)]
    rep["since"] = since
    return rep


def render_fleet(rep: Mapping[str, Any]) -> str:
    ettr = rep["ettr"]
    out = [f"fleet: {rep['runs']} run(s)" + (f" ({rep['runs_unknown']} with no progress seen: "
                                              "goodput unknown)" if rep["runs_unknown"] else ""),
           f"  ETTR (productive / wall)   {'-' if ettr is None else f'{100 * ettr:.1f} %'} "
           f"of {fmt_s(rep['wall_s'])}"]
    for k in PARTS:
        v = rep["badput_s"][k]
        if v:
            out.append(f"  {LABELS[k]:<26} {fmt_s(v)}")
    out.append(f"  incidents                  {rep['incidents']}"
               + (f" ({', '.join(f'{c} {n}' for c, n in rep['incidents_by_cause'].items())})"
                  if rep["incidents"] else ""))
    for c, s in rep["mttf_s"].items():
        out.append(f"  MTTF {c:<21} {fmt_s(s)}")
    for q in ("p50", "p95"):
        v = rep[f"ttr_{q}_s"]
        out.append(f"  time to recover {q}        {'-' if v is None else fmt_s(v)}")
    per = rep["incidents_per_1000_node_hours"]
    out.append(f"  incidents / 1,000 node-h   {'-' if per is None else f'{per:.1f}'} "
               f"({rep['node_hours']:.1f} node-hours)")
    if rep["lemons"]:
        out.append("  lemon nodes: " + clean(", ".join(
            f"{lem['node']} ({len(lem['jobs'])} jobs)" for lem in rep["lemons"])))
    if rep["worst"]:
        out.append("  most badput:")
        out += [clean(f"    {w['job']} {w['run_id'][:12]}: {w['goodput']}") for w in rep["worst"]]
    return "\n".join(out)
