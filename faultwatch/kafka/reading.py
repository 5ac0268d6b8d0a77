"""Reading topics back for people and scripts: `faultwatch decisions` and `faultwatch logs`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiokafka import TopicPartition

from faultwatch.errors import DecodeError, NotFoundError
from faultwatch.eventlog import log_event
from faultwatch.kafka import clients
from faultwatch.kafka.errors import diagnose
from faultwatch.wire import decode

Decoder = Callable[[bytes | None], Any]  # wire.decode, decode_logs, decode_decision, ...


async def _started_reader(bootstrap: str, topic: str) -> Any:
    """A started consumer of no group (a reader's), or the broker's error in words."""
    consumer = clients.consumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                group_id=None,
                                client_id=f"faultwatch-reader-{uuid.uuid4().hex[:6]}")
    try:
        await consumer.start()
    except Exception as e:
        with contextlib.suppress(Exception):
            await consumer.stop()
        raise await diagnose(e, bootstrap, f"reading {topic}") from e
    return consumer


def _missing(topic: str, bootstrap: str) -> NotFoundError:
    return NotFoundError(f"topic {topic!r} does not exist at {bootstrap} (a wrong "
                         "--topic-prefix? or nothing has been written to it yet)")


async def read_topic(bootstrap: str, topic: str, *, follow: bool = False,
                     key: bytes | None = None, decoder: Decoder = decode,
                     poll_ms: int = 500, must_exist: bool = False
                     ) -> AsyncIterator[tuple[Any, Any]]:
    """Decoded records of a topic from the beginning; stop at the end unless following.

    A topic that does not exist yields nothing, or with `must_exist` raises NotFoundError;
    when following, it is waited for (with `must_exist`, a `waiting_for_topic` event says so).

    Undecodable records are reported (topic, partition, offset) and skipped, never fatal.
    """
    consumer = await _started_reader(bootstrap, topic)
    try:
        parts = await partitions(consumer, topic)
        if not parts:
            if must_exist and not follow:
                raise _missing(topic, bootstrap)
            if not follow:
                return
            if must_exist:
                log_event("waiting_for_topic", topic=topic, bootstrap=bootstrap)
            while not parts:
                await asyncio.sleep(poll_ms / 1000)
                parts = await partitions(consumer, topic)
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        done = {tp for tp in tps if end[tp] == 0}
        while follow or len(done) < len(tps):
            batch = await consumer.getmany(timeout_ms=poll_ms)
            for tp, msgs in batch.items():
                for msg in msgs:
                    if key is None or msg.key == key:
                        try:
                            d = decoder(msg.value)
                        except Exception as e:  # noqa: BLE001 - one bad row never stops us
                            report_bad_record(msg, e)
                        else:
                            yield msg, d
                    if msg.offset + 1 >= end[tp]:
                        done.add(tp)
            if not follow:
                for tp in tps:
                    if tp not in done and await consumer.position(tp) >= end[tp]:
                        done.add(tp)
    finally:
        await consumer.stop()


def report_bad_record(msg: Any, error: BaseException) -> None:
    """One `undecodable_record` event naming the topic, partition and offset of a bad row."""
    text = str(error) if isinstance(error, DecodeError) else repr(error)
    log_event("undecodable_record", topic=msg.topic, partition=msg.partition,
              offset=msg.offset, error=text[:300])


async def partitions(consumer: Any, topic: str) -> set[int]:
    """The partitions of `topic` as the broker says now (fresh metadata: new topics too)."""
    await consumer._client.force_metadata_update()  # noqa: SLF001 - refresh for new topics
    return consumer.partitions_for_topic(topic) or set()


def run_reader(gen: AsyncIterator[Any], emit: Callable[[Any], None]) -> int:
    """Drive an async reader to completion from sync CLI code; Ctrl-C ends it quietly."""
    async def main() -> None:
        async for item in gen:
            try:
                emit(item)
            except (BrokenPipeError, KeyboardInterrupt):
                raise
            except Exception as e:  # noqa: BLE001 - a row that decodes but cannot be shown
                msg = item[0] if isinstance(item, tuple) and item else None
                if msg is None or not hasattr(msg, "offset"):
                    raise
                report_bad_record(msg, e)

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:  # `faultwatch logs JOB | head`
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the final flush
        except OSError:
            pass
    return 0


Part = tuple[str, int]  # (topic, partition)


async def read_parts(bootstrap: str, topics: list[str], *, follow: bool = False,
                     since_s: float | None = None, poll_ms: int = 500,
                     hold: Callable[[], set[Any]] = set,
                     ) -> AsyncIterator[tuple[list[Any], dict[Part, bool]]]:
    """Raw records of several topics from the beginning (or from the first record sent at or
    after `since_s`: a record is sent after the lines it holds were read), as (records in
    fetch order, whether each partition is read to its end now), until every partition is at
    its end unless following. The first topic must exist (NotFoundError; when following it
    is waited for, with a `waiting_for_topic` event); the others are read if they exist.
    Partitions in `hold()` (asked after each fetch) are paused until they leave it."""
    consumer = await _started_reader(bootstrap, topics[0])
    try:
        first = await partitions(consumer, topics[0])
        if not first:
            if not follow:
                raise _missing(topics[0], bootstrap)
            log_event("waiting_for_topic", topic=topics[0], bootstrap=bootstrap)
            while not first:
                await asyncio.sleep(poll_ms / 1000)
                first = await partitions(consumer, topics[0])
        tps = [TopicPartition(topics[0], p) for p in sorted(first)]
        for t in topics[1:]:
            tps += [TopicPartition(t, p) for p in sorted(await partitions(consumer, t))]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        if since_s is not None:
            found = await consumer.offsets_for_times({tp: int(since_s * 1000) for tp in tps})
            for tp, at in found.items():
                if at is None:
                    await consumer.seek_to_end(tp)
                else:
                    consumer.seek(tp, at.offset)
        end = await consumer.end_offsets(tps)

        async def ends() -> dict[Part, bool]:
            out = {}
            for tp in tps:
                top = end[tp] if not follow else max(end[tp], consumer.highwater(tp) or 0)
                out[(tp.topic, tp.partition)] = await consumer.position(tp) >= top
            return out

        at_end = await ends()
        yield [], at_end
        paused: set[Any] = set()
        while follow or not all(at_end.values()):
            batch = await consumer.getmany(timeout_ms=poll_ms)
            records = [m for msgs in batch.values() for m in msgs]
            at_end = await ends()
            yield records, at_end
            want = {tp for tp in tps if (tp.topic, tp.partition) in hold()}
            if want != paused:
                consumer.resume(*(paused - want))
                consumer.pause(*(want - paused))
                paused = want
    finally:
        await consumer.stop()
