"""Async execution mode with real agents: same error limit and max failure rate."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultwatch.agents.exitcodes import EXIT_UNDECIDED
from tests.support.cluster import decisions, processor, wait_processor_ready
from tests.support.scenarios import agents, new_job, policy_file, scenario, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

ERR = "RuntimeError: Socket Timeout"


@pytest.fixture(scope="module")
def cluster(kafka_bootstrap: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    prefix = f"asy{uuid.uuid4().hex[:8]}."
    d = tmp_path_factory.mktemp("asyproc")
    pol = policy_file(d / "policy.yaml", execution_mode="async", max_failure_rate=0.5,
                      max_same_error=1, max_restarts=5, settle_s=2.0, enable_restart=True,
                      hang_detection=False, restart_backoff_s=0.1)
    log = d / "processor.log"
    with processor(kafka_bootstrap, prefix, log, "--rules", str(pol)) as proc:
        wait_processor_ready(kafka_bootstrap, prefix, proc, log)
        yield kafka_bootstrap, prefix
        assert proc.poll() is None, f"processor died:\n{log.read_text()[-4000:]}"


def test_same_error_on_the_same_instance_fails_the_job(cluster: tuple[str, str],
                                                       tmp_path: Path) -> None:
    bootstrap, prefix = cluster
    job = new_job("same")
    with agents(bootstrap, prefix, tmp_path) as a:
        for attempt in range(2):  # a healthy second node keeps the failure rate at 1/2
            a.start(job, "node-1", scenario("forever", 0.5), attempt=attempt)
            assert a.run(job, "node-0", scenario("fail", ERR), attempt=attempt) == EXIT_UNDECIDED
            wait_for(bootstrap, prefix, job, lambda d, n=attempt: len(d) > n, timeout_s=30)
            a.stop_all()
    decs = decisions(bootstrap, prefix, job)
    assert [d["action"] for d in decs] == ["restart", "fail"], decs
    assert decs[1]["reason"]["message"].startswith("same error 2 times (max 1)")
    assert decs[1]["evidence"]["same_error_count"] == 2


def test_failure_rate_in_async_mode(cluster: tuple[str, str], tmp_path: Path) -> None:
    bootstrap, prefix = cluster
    one, two = new_job("rate1"), new_job("rate2")
    with agents(bootstrap, prefix, tmp_path) as a:
        for job, failing in ((one, 1), (two, 2)):
            for i in range(3):
                cmd = scenario("fail", ERR) if i < failing else scenario("forever", 0.5)
                a.start(job, f"node-{i}", cmd)
        d1 = wait_for(bootstrap, prefix, one, bool, timeout_s=40)
        d2 = wait_for(bootstrap, prefix, two, bool, timeout_s=40)
    # 1 of 3 failed (0.33 <= 0.5): restart only the failed instance
    assert [(d["action"], d["targets"]["nodes"]) for d in d1] == [("restart", ["node-0"])], d1
    # 2 of 3 failed (0.67 > 0.5): the job fails
    assert [d["action"] for d in d2] == ["fail"], d2
    assert d2[0]["evidence"]["failure_rate"] == pytest.approx(2 / 3)
