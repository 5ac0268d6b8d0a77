"""The incidents topic (job stage -> `faultwatch report`, dashboards, the lemon watch): one
record per job run, its ledger and goodput account, keyed by job and run (compacted: each
run's latest); and the acted topic (actuators -> reports: what was done for a decision)."""

from __future__ import annotations

import math
from typing import Any

import orjson

from faultwatch.core.goodput import Account
from faultwatch.core.ledger import Ledger
from faultwatch.errors import DecodeError
from faultwatch.wire._check import (
    SCHEMA_VERSION,
    _bad,
    _bool,
    _get,
    _json_obj,
    _num,
    _text,
    decode,
    safe_name,
)

KEY_SEP = "\x1f"  # job names hold no control characters (safe_name): the key splits cleanly


def incident_key(job: str, run_id: str) -> bytes:
    """A run's key: its job name and run id (a reused name is a new run, a new record)."""
    return f"{job}{KEY_SEP}{run_id}".encode()


def encode_ledger(led: Ledger, acc: Account, ts: float, final: bool = False) -> bytes:
    """{"v", "t": "ledger", "job", "run_id", "ts" (when published), "final" (the run was
    replaced or left the processor), "ledger" (core/ledger.py), "account" (core/goodput.py)}."""
    return orjson.dumps({"v": SCHEMA_VERSION, "t": "ledger", "job": led.job,
                         "run_id": led.run_id, "ts": ts, "final": final,
                         "ledger": led.to_dict(), "account": acc.to_dict()})


def _finite(x: Any, field: str, depth: int = 0) -> None:
    """Every number in `x` finite (a string "inf" would become one in Ledger.from_dict)."""
    if isinstance(x, float) and not math.isfinite(x):
        raise _bad(field, "numbers must be finite", x)
    if depth < 6 and isinstance(x, dict):
        for v in x.values():
            _finite(v, field, depth + 1)
    elif depth < 6 and isinstance(x, list):
        for v in x:
            _finite(v, field, depth + 1)


def decode_ledger(value: bytes | None) -> tuple[dict[str, Any], Ledger]:
    """A ledger record: its fields checked, and the Ledger it holds (DecodeError otherwise:
    names are safe, numbers finite, the ledger's job is the record's)."""
    d = decode(value)
    if d["t"] != "ledger":
        raise _bad("ledger.t", "must be 'ledger'", d["t"])
    job = safe_name(_get(d, "job", "ledger"), "ledger.job")
    safe_name(d.get("run_id", ""), "ledger.run_id", empty_ok=True)
    _num(_get(d, "ts", "ledger"), "ledger.ts")
    _bool(d.get("final", False), "ledger.final")
    raw = _json_obj(_get(d, "ledger", "ledger"), "ledger.ledger")
    _json_obj(_get(d, "account", "ledger"), "ledger.account")
    try:
        led = Ledger.from_dict(raw)
        times = [led.first_ts, led.last_ts, *(t for t, _s, _a in led.samples)]
        for a in led.attempts:
            times += [a.launch_ts, a.end_ts, a.first_step_ts, a.last_step_ts]
            times += [x for _k, s, e in a.spans for x in (s, e)]
        for i in led.incidents:
            for n in i.nodes:
                safe_name(n, "ledger.incidents.nodes")
            safe_name(i.id, "ledger.incidents.id")
            _text(i.message, "ledger.incidents.message", 4000)
            times += [i.first_sign_ts, i.detected_ts, i.acted_ts, i.recovered_ts,
                      i.last_progress_ts, i.ckpt_ts]
        for t in times:
            if t is not None:
                _num(t, "ledger: a time")  # finite, in range
        for n in led.nodes:
            safe_name(n, "ledger.nodes")
    except DecodeError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise DecodeError(f"ledger.ledger: {type(e).__name__}: {str(e)[:200]}") from None
    if led.job != job:
        raise _bad("ledger.ledger.job", f"must be the record's job {job!r}", led.job)
    _finite(raw, "ledger.ledger")
    return d, led


# ---- the acted topic: what an actuator did for a decision ----------------------------------

def encode_acted(decision: str, job: str, node: str, action: str, backend: str, result: str,
                 ts: float) -> bytes:
    """{"v", "t": "acted", "decision" (its id), "job", "node", "action" (quarantine, release,
    ...), "backend" (slurm, kubernetes, exec), "result", "ts" (when it was done)}."""
    return orjson.dumps({"v": SCHEMA_VERSION, "t": "acted", "decision": decision, "job": job,
                         "node": node, "action": action, "backend": backend,
                         "result": result[:1000], "ts": ts})


def decode_acted(value: bytes | None) -> dict[str, Any]:
    d = decode(value)
    if d["t"] != "acted":
        raise _bad("acted.t", "must be 'acted'", d["t"])
    safe_name(_get(d, "decision", "acted"), "acted.decision")
    safe_name(_get(d, "job", "acted"), "acted.job", empty_ok=True)
    safe_name(_get(d, "node", "acted"), "acted.node")
    safe_name(_get(d, "action", "acted"), "acted.action")
    safe_name(_get(d, "backend", "acted"), "acted.backend")
    _text(_get(d, "result", "acted"), "acted.result", 1000)
    _num(_get(d, "ts", "acted"), "acted.ts")
    return d
