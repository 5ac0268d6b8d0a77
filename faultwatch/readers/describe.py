"""`faultwatch describe JOB`: everything known of one job in one view, like `kubectl describe`
and `scontrol show job`: its run and scheduler identity, phase, attempt and restarts; nodes
and ranks with their exits and quiet times; the silence window in force and why; holds and
mutes (in force and ended); every run and attempt with its decisions; the processors'
refusals of its agents' records. Read from the status, decisions, holds and control topics
(each once, the decisions and control topics by the job's key)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from faultwatch.errors import NotFoundError
from faultwatch.wire.topics import Topics

MAX_DECISIONS = 50  # the newest shown (the total is counted)
MAX_NOTICES = 20


def _clock(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts))


def _age(x: Any) -> str:
    return "-" if x is None else f"{float(x):.0f}s"


def _dash(x: Any) -> str:
    return "-" if x is None else str(x)


def _columns(head: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned columns two spaces apart, indented by two (kubectl's tables)."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in [head, *rows]]


async def _keyed(bootstrap: str, topic: str, job: str) -> list[Any]:
    """The job's decisions on `topic` (decisions or control), each id once, in order."""
    from faultwatch.kafka.reading import read_topic
    from faultwatch.wire import decode_decision, job_key

    out, seen = [], set()
    async for _msg, dec in read_topic(bootstrap, topic, key=job_key(job),
                                      decoder=decode_decision):
        if dec.id not in seen:
            seen.add(dec.id)
            out.append(dec)
    return out


async def gather(bootstrap: str, topics: Topics, job: str) -> dict[str, Any]:
    """Everything `describe` shows of `job`, as one JSON-able object; NotFoundError when no
    topic knows the job."""
    from faultwatch.core.diagnosis import is_probe
    from faultwatch.holds.store import load_holds
    from faultwatch.readers.status import read_status
    from faultwatch.trust.refusals import is_refusal
    from faultwatch.wire import decision_to_dict

    (snaps, _workers), decs, control, holds = await asyncio.gather(
        read_status(bootstrap, topics.status, job, must_exist=False),
        _keyed(bootstrap, topics.decisions, job), _keyed(bootstrap, topics.control, job),
        load_holds(bootstrap, topics.holds))
    now = time.time()
    snap = snaps.get(job)
    mine = sorted((h for h in holds.holds.values() if h.job == job), key=lambda h: h.kind)
    decisions = [d for d in decs if not is_probe(d)]
    refusals = [d for d in control if is_refusal(d)]
    probes = [d for d in [*control, *decs] if is_probe(d)]
    if snap is None and not decisions and not mine and not refusals:
        raise NotFoundError(f"no processor reports job {job!r} and no decision, hold or "
                            f"refusal names it (on {topics.prefix}*); `faultwatch status` "
                            "lists the jobs")
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    for d in decisions:
        r = runs.setdefault((d.run_id, d.attempt), {"run_id": d.run_id, "attempt": d.attempt,
                                                    "first_ts": d.ts, "decisions": []})
        r["decisions"].append(f"{d.action} {d.kind} {d.id[:12]}")
    if snap is not None:
        runs.setdefault((str(snap.get("run_id") or ""), int(snap.get("attempt", 0))),
                        {"run_id": snap.get("run_id"), "attempt": snap.get("attempt"),
                         "first_ts": None, "decisions": []})["current"] = True
    return {"job": job, "now": now, "status": snap,
            "holds": [{**h.to_dict(), "in_force": h.in_force(now)} for h in mine],
            "runs": sorted(runs.values(), key=lambda r: (r["first_ts"] is None,
                                                         r["first_ts"] or 0.0)),
            "decisions_total": len(decisions),
            "decisions": [decision_to_dict(d) for d in decisions[-MAX_DECISIONS:]],
            "refusals": [decision_to_dict(d) for d in refusals[-MAX_NOTICES:]],
            "diagnosis_requests": len(probes)}


def lines(view: Mapping[str, Any]) -> list[str]:
    """The text of `describe` (kubectl's layout: `Field:  value`, then sections)."""
    from faultwatch.core.holds import Hold

    now = float(view["now"])
    s = view.get("status") or {}
    out = [f"Job:            {view['job']}"]
    if s:
        age = now - float(s.get("ts", now))
        sched = s.get("scheduler") or {}
        out += [f"Run:            {s.get('run_id')} (from {s.get('run_source') or '-'})"
                + ("  scheduler " + " ".join(f"{k}={v}" for k, v in sched.items())
                   if isinstance(sched, dict) and sched else ""),
                f"Phase:          {s.get('phase')}    attempt {s.get('attempt')}    "
                f"restarts used {s.get('restarts_used')}",
                f"Snapshot:       {age:.0f}s ago (the ages below are as of then)",
                f"Nodes:          {s.get('nodes_alive')}/"
                f"{s.get('expected_nodes') or s.get('nodes_total')} alive    ranks "
                f"{s.get('ranks_total')}"
                + (f"/{s['expected_world']}" if s.get("expected_world") else ""),
                f"Last output:    {_age(s.get('last_output_age_s'))} ago    steps "
                f"{s.get('steps')}",
                "Window:         " + ("off" if s.get("window_s") is None else
                                      f"{float(s['window_s']):.0f}s")
                + f" ({s.get('window_why') or s.get('window_basis')})"
                + (f"; stages open: {', '.join(s['stages'])}" if s.get("stages") else "")]
    else:
        out.append("Status:         no processor reports it now (finished long ago, or its "
                   "records never reached a job stage: see Refusals)")
    holds = [Hold.from_dict(h) for h in view.get("holds") or ()]
    out.append("Holds:          " + ("; ".join(f"{h.kind}: {h.describe(now)}" for h in holds)
                                     if holds else "-"))
    if s.get("nodes"):
        out += ["", "Nodes:", *_columns(
            ["NODE", "RANK", "ALIVE", "EXIT", "LAST OUTPUT", "LAST HEARTBEAT"],
            [[str(n.get("node")), _dash(n.get("rank")), "yes" if n.get("alive") else "no",
              _dash(n.get("exit_code")), _age(n.get("last_output_age_s")),
              _age(n.get("last_heartbeat_age_s"))] for n in s["nodes"]])]
    if s.get("rank_last_output_age_s"):
        out += ["", "Quiet time per rank (quietest first):",
                "  " + "  ".join(f"{'r' + str(r) if int(r) >= 0 else 'node'}:{_age(a)}"
                                 for r, a in s["rank_last_output_age_s"])]
    out += ["", "Runs and attempts:"]
    for r in view.get("runs") or ():
        out.append(f"  run {r.get('run_id') or '-'}  attempt {r.get('attempt')}"
                   + ("  (current)" if r.get("current") else "")
                   + (f"  first decision {_clock(r['first_ts'])}" if r.get("first_ts") else "")
                   + (f": {'; '.join(r['decisions'])}" if r.get("decisions") else ""))
    total = int(view.get("decisions_total", 0))
    shown = view.get("decisions") or []
    out += ["", f"Decisions ({total}" + (f", the last {len(shown)}" if total > len(shown)
                                          else "") + "):"]
    for d in shown:
        reason = d.get("reason") or {}
        held = (d.get("evidence") or {}).get("held")
        out.append(f"  {_clock(d.get('ts'))}  {d.get('action')}  {reason.get('kind')}"
                   + (f"  rule {reason['rule']}" if reason.get("rule") else "")
                   + f"  attempt {d.get('attempt')}  {str(d.get('id'))[:12]}"
                   + (f"  (held by {held.get('by')}: would {held.get('action')})"
                      if isinstance(held, dict) else ""))
        out.append(f"      {str(d.get('message', ''))[:300]}")
    if not shown:
        out.append("  -")
    out += ["", "Refusals:"]
    for d in view.get("refusals") or ():
        out.append(f"  {_clock(d.get('ts'))}  {str(d.get('message', ''))[:400]}")
    if not view.get("refusals"):
        out.append("  -")
    if view.get("diagnosis_requests"):
        out += ["", f"Diagnosis requests: {view['diagnosis_requests']} (`faultwatch "
                    f"diagnose {view['job']}` asks again)"]
    return out


def describe(bootstrap: str, topics: Topics, job: str, as_json: bool) -> int:
    import orjson

    from faultwatch.eventlog import clean
    from faultwatch.kafka.errors import BROKER_ERRORS, broker_error

    try:
        view = asyncio.run(gather(bootstrap, topics, job))
    except BROKER_ERRORS as e:
        raise broker_error(e, bootstrap, f"describing job {job}") from None
    if as_json:
        print(orjson.dumps(view).decode())
    else:
        print("\n".join(clean(line) for line in lines(view)))
    return 0
