"""5,000 refused decisions for one job reach the training job's stderr as two lines (the first
one, then a count), not one line each; a signed decision still acts (positive control)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from faultwatch import wire
from faultwatch.agents.config import EXIT_FAILED_BY_DECISION
from faultwatch.wire import signing
from faultwatch.wire.signing import Keyring
from tests.support.signed_decisions import KEY, fail_dict, publish, start_agent

pytestmark = pytest.mark.kafka

STORM = 5000


def publish_many(bootstrap: str, topic: str, job: str, n: int) -> None:
    from aiokafka import AIOKafkaProducer

    async def main() -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
        await p.start()
        try:
            for i in range(n):
                await p.send(topic, orjson.dumps(fail_dict(job, f"unsigned-{i}")),
                             key=wire.job_key(job))
            await p.flush()
        finally:
            await p.stop()

    asyncio.run(main())


def test_a_storm_of_refused_decisions_is_counted_not_written_line_by_line(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    job = "refused-storm"
    topic = f"{topic_prefix}decisions"
    p = start_agent(kafka_bootstrap, topic_prefix, tmp_path, job,
                    {signing.KEY_ENV: f"{KEY.key_id}:{KEY.secret.decode()}"})
    try:
        assert p.stdout is not None and p.stderr is not None
        assert p.stdout.readline() == b"running\n"
        publish_many(kafka_bootstrap, topic, job, STORM)
        publish(kafka_bootstrap, topic, job, signing.sign(fail_dict(job, "real"),
                                                          Keyring((KEY,))))
        _, errb = p.communicate(timeout=120)
        assert p.returncode == EXIT_FAILED_BY_DECISION, errb[-2000:]  # the signed one acted
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    seen = errb.splitlines()
    refused = [x for x in seen if b"event=decision_refused " in x]
    summaries = [x for x in seen if b"event=decision_refused_summary" in x]
    assert len(refused) == 1, len(refused)
    assert summaries and sum(int(x.split(b" count=")[1].split()[0]) for x in summaries) \
        == STORM - 1, summaries
    assert sum(len(x) for x in seen) < 20_000
