"""Which rules each worker runs, for people: the worker record a processor publishes on the
compacted status topic (`faultwatch status`, `faultwatch rules show`), reading it and the
rules topic back, and the text of `rules show` / `rules diff`.

A worker record (wire.tables.encode_worker, key `\\x00worker/<worker>`):

    {"v": 1, "t": "worker", "worker": "host:pid", "group": "faultwatch.processor",
     "ts": <now>, "started_at": ..., "rules": <RulesInForce.describe()>,
     "rejected": {"count": 1, "last": {"version", "at", "errors"}} | absent,
     "trust": {"verifies": [...], "keys": {...}, "node_keys": N},   (trust/announce.py)
     "refused": {"counts": {"rules.unsigned": 1}, "last": {...}} | absent}

is published at start, when the set in force or the refusals change, and every WORKER_S;
a clean stop writes a tombstone. aiokafka is imported lazily (through faultwatch.kafka.reading).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from typing import Any

from faultwatch.core.status import STALE_S, WORKER_S  # noqa: F401 - faust_app reads WORKER_S here
from faultwatch.errors import DecodeError
from faultwatch.rules.layers import RulesInForce
from faultwatch.wire.tables import WORKER_KEY_PREFIX, decode_worker, encode_worker

# ---- reading the status and rules topics back (readers/status.py shows them too) ----------

def split_status(records: list[tuple[bytes | None, bytes | None]]
                 ) -> tuple[list[bytes | None], dict[str, dict[str, Any]]]:
    """(job snapshot values, latest worker record per worker) of status-topic records in
    offset order; a worker's tombstone removes it."""
    jobs: list[bytes | None] = []
    workers: dict[str, dict[str, Any]] = {}
    for key, value in records:
        if key is not None and key.startswith(WORKER_KEY_PREFIX):
            name = key[len(WORKER_KEY_PREFIX):].decode(errors="replace")
            if value is None:
                workers.pop(name, None)
                continue
            try:
                workers[name] = decode_worker(value)
            except DecodeError:
                continue
        else:
            jobs.append(value)
    return jobs, workers


async def read_raw(bootstrap: str, topic: str, must_exist: bool = False
                   ) -> list[tuple[bytes | None, bytes | None]]:
    """(key, value) of every record on a topic now, in offset order ([] if it is missing,
    or a NotFoundError with `must_exist`)."""
    from faultwatch.kafka.reading import read_topic

    out = []
    async for msg, value in read_topic(bootstrap, topic, decoder=lambda v: v,
                                       must_exist=must_exist):
        out.append((msg.key, value))
    return out


async def read_workers(bootstrap: str, status_topic: str, must_exist: bool = False
                       ) -> dict[str, dict[str, Any]]:
    """The live workers' records on the status topic (a missing topic: none, or a
    NotFoundError with `must_exist`)."""
    return split_status(await read_raw(bootstrap, status_topic, must_exist))[1]


async def read_pushed(bootstrap: str, rules_topic: str, must_exist: bool = False
                      ) -> bytes | None:
    """The newest record of the pushed rule set (None: nothing pushed, or a tombstone; a
    missing topic is None, or a NotFoundError with `must_exist`)."""
    latest: bytes | None = None
    for key, value in await read_raw(bootstrap, rules_topic, must_exist):
        if key == b"ruleset":
            latest = value
    return latest


def worker_id() -> str:
    """This worker's name: host (the pod's name in Kubernetes) and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def worker_record(worker: str, group: str, rules: RulesInForce, now: float,
                  started_at: float, rejected: int = 0,
                  last_rejected: Mapping[str, Any] | None = None,
                  trust: Mapping[str, Any] | None = None,
                  refused: Mapping[str, Any] | None = None) -> bytes:
    """The status-topic record of a worker running `rules` (wire.encode_worker): with the
    trust policy it announces and the records it refused."""
    return encode_worker(worker, group, rules.describe(), now, started_at,
                         {"count": rejected, "last": dict(last_rejected or {})}
                         if rejected else None, trust, refused)


def info_labels(rules: RulesInForce) -> dict[str, str]:
    """The labels of the `faultwatch_rules_info` metric: version, source (the top layer),
    layers, push_id."""
    pushed = rules.layer("pushed")
    return {"version": rules.version, "source": rules.source,
            "layers": "+".join(la.name for la in rules.layers),
            "push_id": str(pushed.meta.get("push_id", "")) if pushed else ""}


# ---- text for people ------------------------------------------------------------------------

def _when(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def layer_line(la: Mapping[str, Any]) -> str:
    files = la.get("files") or []
    what = f"{len(files)} files" if la.get("layer") == "builtin" else ", ".join(files) or "-"
    line = f"{la.get('layer', '?'):8} {la.get('rules', 0):4} rules  {what}"
    if la.get("push_id") or la.get("author"):
        line += (f"  push {la.get('push_id', '-')} by {la.get('author', '-')} at "
                 f"{_when(la.get('pushed_at'))}")
        if la.get("revision") is not None:
            line += f", revision {la['revision']}"
            if la.get("rollback_of") is not None:
                line += f" (rollback of {la['rollback_of']})"
        if la.get("at"):
            line += f" ({la['at']})"
    return line


def describe_lines(d: Mapping[str, Any], rule_id: str | None = None,
                   why: list[str] | None = None) -> list[str]:
    """The body of `rules show` for one set in force (a RulesInForce.describe())."""
    out = [f"  rules version {d.get('version')}  ({d.get('rules')} rules, top layer "
           f"{d.get('source')})", "  layers, lowest first (a higher layer wins):"]
    out += [f"    {layer_line(la)}" for la in d.get("layers", [])]
    flags = d.get("flags") or {}
    out.append("    flags    " + (", ".join(f"{k}={v}" for k, v in flags.items()) or "-"))
    origins = d.get("origins") or {}
    if rule_id is not None:
        chain = why if why is not None else (
            [*origins[rule_id], "in force"] if rule_id in origins else
            [f"disabled at {d['disabled'][rule_id]}"] if rule_id in (d.get("disabled") or {})
            else [])
        if not chain:
            chain = ["built-in, not overridden"]
        out.append(f"  rule {rule_id}: " + " <- ".join(reversed(chain)))
        return out
    over = {k: v for k, v in origins.items() if len(v) > 1}
    if over:
        out.append("  overridden by id (earliest first):")
        out += [f"    {rid}: {' -> '.join(chain)}" for rid, chain in sorted(over.items())]
    if d.get("disabled"):
        out.append("  disabled: " + ", ".join(f"{k} ({v})" for k, v in d["disabled"].items()))
    pol = {k: v for k, v in (d.get("policy_origins") or {}).items()}
    if pol:
        out.append("  policy set by: " + ", ".join(f"{k}={v}" for k, v in sorted(pol.items())))
    return out


def worker_lines(rec: Mapping[str, Any], now: float, rule_id: str | None = None) -> list[str]:
    age = now - float(rec.get("ts", now))
    stale = f"  STALE (no record for {age:.0f} s: stopped or lost?)" if age > STALE_S else ""
    out = [f"worker {rec.get('worker')}  group {rec.get('group')}  seen {age:.0f} s ago{stale}"]
    out += describe_lines(rec.get("rules") or {}, rule_id)
    rej = rec.get("rejected")
    if rej:
        last = rej.get("last") or {}
        out.append(f"  refused pushes: {rej.get('count')}; last {last.get('version')} at "
                   f"{last.get('at')}: {' | '.join(last.get('errors') or [])[:400]}")
    return out + trust_lines(rec, now)


def trust_lines(rec: Mapping[str, Any], now: float) -> list[str]:
    """What a worker record says of its trust file and the records it refused."""
    out: list[str] = []
    trust = rec.get("trust")
    if isinstance(trust, Mapping):
        verifies = list(trust.get("verifies") or ())
        out.append("  trust file: " + (f"verifies {', '.join(map(str, verifies))}" if verifies
                                       else "none (unsigned records are taken)"))
    refused = rec.get("refused")
    counts = refused.get("counts") if isinstance(refused, Mapping) else None
    if isinstance(counts, Mapping) and counts:
        out.append("  refused records: " + ", ".join(f"{k} {v}" for k, v in
                                                     sorted(counts.items())))
        last = refused.get("last") if isinstance(refused, Mapping) else None
        for what, d in sorted((last or {}).items()):
            if isinstance(d, Mapping):
                ts = d.get("ts")
                ago = f"{now - float(ts):.0f} s ago" if isinstance(ts, int | float) else "-"
                out.append(f"    last {what}: {d.get('reason')} {ago}: "
                           f"{str(d.get('detail', ''))[:300]}")
    return out


def refused_count(rec: Mapping[str, Any]) -> int:
    """Records a worker refused: invalid pushed sets and what its trust file refused."""
    refused = rec.get("refused")
    counts = refused.get("counts") if isinstance(refused, Mapping) else None
    trust = sum(int(v) for v in counts.values() if isinstance(v, int)) \
        if isinstance(counts, Mapping) else 0
    rejected = rec.get("rejected")
    return trust + (int(rejected.get("count", 0)) if isinstance(rejected, Mapping) else 0)


async def read_live_workers(bootstrap: str, status_topic: str, now: float
                            ) -> dict[str, dict[str, Any]]:
    """The records of the workers alive now (a record within STALE_S), read from the status
    topic's last STALE_S + WORKER_S seconds only: a live worker refreshes its record every
    WORKER_S, and the job snapshots before that are not read. A missing topic: none."""
    from faultwatch.errors import NotFoundError
    from faultwatch.kafka.reading import read_parts

    records: list[tuple[bytes | None, bytes | None]] = []
    try:
        async for batch, _ in read_parts(bootstrap, [status_topic],
                                         since_s=now - STALE_S - WORKER_S):
            records += [(m.key, m.value) for m in batch
                        if m.key is not None and m.key.startswith(WORKER_KEY_PREFIX)]
    except NotFoundError:
        return {}
    return {name: w for name, w in split_status(records)[1].items()
            if now - float(w.get("ts", 0.0)) <= STALE_S}
