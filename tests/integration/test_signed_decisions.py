"""A real agent with a decision key refuses unsigned and forged decisions, obeys signed ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from faultwatch.agents.config import EXIT_FAILED_BY_DECISION
from faultwatch.wire import signing
from faultwatch.wire.signing import Key, Keyring
from tests.support.signed_decisions import KEY, fail_dict, lines_of, publish, start_agent, wait_line

pytestmark = pytest.mark.kafka

FOREVER = "import time\nprint('running', flush=True)\nwhile True: time.sleep(0.05)\n"


def test_forged_and_unsigned_fail_decisions_do_not_stop_an_agent_with_a_key(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    job = "signed-fail"
    topic = f"{topic_prefix}decisions"
    p = start_agent(kafka_bootstrap, topic_prefix, tmp_path, job,
                    {signing.KEY_ENV: f"{KEY.key_id}:{KEY.secret.decode()}"})
    try:
        assert p.stdout is not None and p.stderr is not None
        assert p.stdout.readline() == b"running\n"
        err = lines_of(p.stderr)
        seen: list[bytes] = []
        forged = signing.sign(fail_dict(job, "forged"),
                              Keyring((Key(KEY.key_id, b"attacker-guess-0123456789"),)))
        publish(kafka_bootstrap, topic, job, fail_dict(job, "unsigned"), forged)
        first = wait_line(err, b"event=decision_refused", 60, seen)
        second = wait_line(err, b"event=decision_refused", 30, seen)
        assert b"reason=unsigned" in first and b"id=unsigned" in first
        assert b"reason=bad_signature" in second and b"id=forged" in second
        assert p.poll() is None  # still running after two fail decisions
        # positive control: the same decision signed with the agent's key stops it
        publish(kafka_bootstrap, topic, job, signing.sign(fail_dict(job, "real"),
                                                          Keyring((KEY,))))
        assert p.wait(timeout=60) == EXIT_FAILED_BY_DECISION
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_without_a_key_the_agent_warns_once_and_obeys(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    job = "unsigned-fail"
    p = start_agent(kafka_bootstrap, topic_prefix, tmp_path, job, {})
    try:
        assert p.stdout is not None and p.stdout.readline() == b"running\n"
        publish(kafka_bootstrap, f"{topic_prefix}decisions", job, fail_dict(job, "plain"))
        _, err = p.communicate(timeout=60)
        assert p.returncode == EXIT_FAILED_BY_DECISION, err.decode()[-3000:]
        assert err.count(b"event=decisions_unverified") == 1, err.decode()[-3000:]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
