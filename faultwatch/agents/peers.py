"""Start skew: announce this agent with a `hello` note and wait until N nodes of the job are up.

The hello is keyed by the job (not job/node), so every hello of a job lands on one partition
of the logs topic and an agent reads back just that partition from a time window."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson

from faultwatch import wire
from faultwatch.kafka import clients

Log = Callable[..., None]
_MARGIN_S = 60.0


def hello_data(run_id: str, node: str, rank: int | None, host: str, started_ts: float
               ) -> dict[str, Any]:
    return {"run_id": run_id, "node": node, "rank": rank, "host": host,
            "agent_start_ts": started_ts}


def hello_nodes(records: list[tuple[bytes | None, bytes]], job: str, attempt: int,
                since_ts: float) -> dict[str, float]:
    """Node -> first hello time among raw (key, value) logs records: this job and attempt."""
    key = wire.job_key(job)
    nodes: dict[str, float] = {}
    for k, v in records:
        if k != key or b'"hello"' not in v:
            continue
        try:
            d = orjson.loads(v)
        except orjson.JSONDecodeError:
            continue
        if (isinstance(d, dict) and d.get("t") == "note" and d.get("kind") == "hello"
                and d.get("job") == job and d.get("attempt") == attempt
                and float(d.get("ts") or 0) >= since_ts):
            node = str(d.get("node"))
            nodes[node] = min(nodes.get(node, float("inf")), float(d["ts"]))
    return nodes


async def wait_for_nodes(bootstrap: str, topic: str, job: str, attempt: int, want: int,
                         timeout_s: float, log: Log) -> dict[str, float]:
    """Read hellos of (job, attempt) until `want` nodes are seen or timeout; node -> ts."""
    from aiokafka import TopicPartition  # type: ignore[import-untyped,unused-ignore]
    from aiokafka.partitioner import murmur2  # type: ignore[import-untyped,unused-ignore]

    since = time.time() - timeout_s - _MARGIN_S
    deadline = time.monotonic() + timeout_s
    seen: dict[str, float] = {}
    last_report = 0.0
    while time.monotonic() < deadline:
        c = clients.consumer(bootstrap_servers=bootstrap, group_id=None,
                             enable_auto_commit=False, request_timeout_ms=10000,
                             client_id=f"faultwatch-agent-peers-{uuid.uuid4().hex[:6]}")
        try:
            await asyncio.wait_for(c.start(), max(1.0, deadline - time.monotonic()))
            parts: set[int] = set()
            while not parts and time.monotonic() < deadline:
                await c._client.force_metadata_update()  # noqa: SLF001
                parts = c.partitions_for_topic(topic) or set()
                if not parts:
                    await asyncio.sleep(0.5)
            if not parts:
                break
            ordered = sorted(parts)
            tp = TopicPartition(topic, ordered[(murmur2(wire.job_key(job)) & 0x7FFFFFFF)
                                               % len(ordered)])
            c.assign([tp])
            off = None
            while off is None and time.monotonic() < deadline:
                off = (await c.offsets_for_times({tp: int(since * 1000)})).get(tp)
                if off is None:  # nothing on the partition since then, not even our own
                    await asyncio.sleep(0.2)  # hello (sent asynchronously): starting at the
                    #                           end could skip it, so ask again
            if off is None:
                break
            c.seek(tp, off.offset)
            while time.monotonic() < deadline:
                batch = await c.getmany(timeout_ms=500)
                recs = [(m.key, m.value) for msgs in batch.values() for m in msgs]
                for node, ts in hello_nodes(recs, job, attempt, since).items():
                    seen.setdefault(node, ts)
                if len(seen) >= want:
                    return seen
                if time.monotonic() - last_report > 10:
                    last_report = time.monotonic()
                    log("waiting_for_nodes", want=want, up=len(seen),
                        nodes=",".join(sorted(seen)) or "-")
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - broker down: keep trying until the deadline
            log("waiting_for_nodes_unavailable", error=repr(e)[:200])
            await asyncio.sleep(1.0)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.stop(), 5)
    return seen
