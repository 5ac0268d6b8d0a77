"""Reading a topic that does not exist is an error (issue 21, item 4), on the real broker and
through the real command: `decisions`, `logs`, `status`, `nodes`, `diagnose`, `rules show` and
`rules diff` under a prefix nobody wrote to exit 7 and name the topic; once the topics exist
the same commands exit 0, or 7 for the unknown job they name (the positive control); `-f`
waits for the topic and says so; an abbreviated option is refused."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from faultwatch.errors import EXIT_NOT_FOUND, EXIT_USAGE
from faultwatch.kafka.admin import ensure_compacted_topic, ensure_topics
from faultwatch.rules.loader import BUILTIN_DIR
from faultwatch.wire.topics import Topics
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

READERS = {  # command -> the topic it reads
    ("decisions",): "decisions",
    ("logs", "job-x"): "logs",
    ("status",): "status",
    ("status", "--json"): "status",
    ("nodes",): "nodes",
    ("diagnose", "job-x"): "status",
    ("rules", "show"): "status",  # not "no worker records": a wrong prefix says so
    ("rules", "show", "--json"): "status",
    ("rules", "diff", str(BUILTIN_DIR / "nccl.yaml")): "rules",  # not "nothing pushed"
}
UNKNOWN_JOB = {"logs": "no record of job 'job-x'", "diagnose": "no processor reports job 'job-x'"}


def _fw(bootstrap: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "faultwatch", *args, "--bootstrap", bootstrap,
                           "--topic-prefix", prefix], capture_output=True, text=True,
                          timeout=120)


def test_reading_a_missing_topic_is_an_error_until_it_exists(kafka_bootstrap: str,
                                                             topic_prefix: str) -> None:
    for argv, topic in READERS.items():
        res = _fw(kafka_bootstrap, topic_prefix, *argv)
        assert res.returncode == EXIT_NOT_FOUND, (argv, res.returncode, res.stderr)
        assert f"topic '{topic_prefix}{topic}' does not exist" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr and res.stdout == "", (argv, res.stdout)

    asyncio.run(ensure_topics(kafka_bootstrap, Topics(topic_prefix)))
    asyncio.run(ensure_compacted_topic(kafka_bootstrap, Topics(topic_prefix).nodes))
    for argv in READERS:  # positive control: the same commands on existing, empty topics
        res = _fw(kafka_bootstrap, topic_prefix, *argv)
        if argv[0] in UNKNOWN_JOB:  # the topic exists, the job does not: still 7, another message
            assert res.returncode == EXIT_NOT_FOUND, (argv, res.returncode, res.stderr)
            assert UNKNOWN_JOB[argv[0]] in res.stderr, res.stderr
            continue
        assert res.returncode == 0, (argv, res.returncode, res.stderr)


def test_an_abbreviated_prefix_option_is_refused(kafka_bootstrap: str,
                                                 topic_prefix: str) -> None:
    res = subprocess.run([sys.executable, "-m", "faultwatch", "decisions", "--bootstrap",
                          kafka_bootstrap, "--topic", topic_prefix], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == EXIT_USAGE, res.stderr
    assert "unrecognized arguments: --topic" in res.stderr


def test_following_a_missing_topic_waits_and_says_so(kafka_bootstrap: str, topic_prefix: str,
                                                     tmp_path: Path) -> None:
    err = tmp_path / "stderr"
    with err.open("w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "faultwatch", "decisions", "-f",
                                 "--bootstrap", kafka_bootstrap, "--topic-prefix",
                                 topic_prefix], stdout=subprocess.DEVNULL, stderr=f, text=True)
    try:
        wait_until(lambda: "event=waiting_for_topic" in err.read_text(), 60,
                   "the waiting_for_topic event")
        assert proc.poll() is None, err.read_text()  # still waiting, not failed
        assert f"topic={topic_prefix}decisions" in err.read_text()
    finally:
        proc.terminate()
        proc.wait(30)


UNREACHABLE = [  # every command that reads or writes Kafka and ends (not the agent: it spools)
    ("decisions",), ("logs", "job-x"), ("status",), ("nodes",), ("diagnose", "job-x"),
    ("rules", "show"), ("rules", "diff", str(BUILTIN_DIR / "nccl.yaml")),
    ("rules", "push", str(BUILTIN_DIR / "nccl.yaml")), ("nodes", "release", "n1"),
    ("notify", "--webhook", "http://127.0.0.1:9/x"), ("kafka", "acls", "--apply"),
]


def test_an_unreachable_broker_is_one_exit_code_in_every_command(topic_prefix: str) -> None:
    """One error class, one code (issue 21, item 4): no broker listens on the port, and every
    command says so the same way, with BrokerError's exit code (5), never a traceback."""
    from faultwatch.errors import EXIT_BROKER
    from faultwatch.kafka.broker import free_port

    nobody = f"127.0.0.1:{free_port()}"
    for argv in UNREACHABLE:
        res = _fw(nobody, topic_prefix, *argv)
        assert res.returncode == EXIT_BROKER, (argv, res.returncode, res.stderr[-2000:])
        assert "Kafka is unreachable or refused the connection" in res.stderr, (argv, res.stderr)
        assert "Traceback" not in res.stderr, (argv, res.stderr)
