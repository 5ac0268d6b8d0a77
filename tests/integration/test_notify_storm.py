"""A storm of decisions through a real `faultwatch notify` to local webhooks: posts stay within
the rate limits, the rest arrive as digests, hostile job names and log text are escaped, and
webhook secrets given by file or environment appear neither in logs nor in the command line."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.notify import Hook, dec, publish
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

STORM = int(os.environ.get("FAULTWATCH_NOTIFY_STORM", "2000"))
PER_HOOK = 10
DIGEST_S = 3.0
TOKEN = "SECRETTOKEN0123456789"
HOSTILE_JOB = "<!channel> <https://evil.example/login|Click here to fix> <@U024BE7LH>"
HOSTILE_LINE = "``` <!here> &amp; see https://evil.example/x ```"


def test_a_storm_is_rate_limited_into_digests_and_hostile_text_is_escaped(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    slack_hook, json_hook = Hook(), Hook()
    topic = f"{topic_prefix}decisions"
    hostile = dec(HOSTILE_JOB, 0, kind="error")
    hostile["reason"]["message"] = HOSTILE_LINE
    storm = [hostile] + [dec(f"job-{i}", i, kind=("hang", "error")[i % 2])
                         for i in range(1, STORM)]
    asyncio.run(publish(kafka_bootstrap, topic, storm))
    hooks_file = tmp_path / "webhooks"
    hooks_file.write_text(f"# the Slack hook\nslack={slack_hook.url}/services/T1/B2/{TOKEN}\n")
    env = {**os.environ, "FAULTWATCH_BOOTSTRAP": kafka_bootstrap,
           "FAULTWATCH_WEBHOOKS": f"json={json_hook.url}?token={TOKEN}"}
    env.pop("FAULTWATCH_DECISION_KEY", None)
    p = subprocess.Popen([sys.executable, "-m", "faultwatch", "notify", "--topic-prefix",
                          topic_prefix, "--webhook-file", str(hooks_file),
                          "--group-wait-s", "1", "--from-beginning",
                          "--max-posts-per-min", str(PER_HOOK),
                          "--max-posts-per-min-total", "100", "--digest-interval-s", str(DIGEST_S),
                          "--min-post-gap-s", "0.2", "--group-id", f"g{uuid.uuid4().hex[:8]}"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        cmdline = Path(f"/proc/{p.pid}/cmdline").read_bytes()

        def counted() -> int:
            posts = [b for _, b in json_hook.accepted()]
            return sum(b["decisions"] if b.get("digest") else len(b["new_ids"])
                       for b in posts)

        wait_until(lambda: counted() >= STORM, 90, "every decision posted or digested")
        wait_until(lambda: any("more decision" in b["text"] for _, b in slack_hook.accepted()),
                   30, "the Slack digest")
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
        slack_hook.server.shutdown()
        json_hook.server.shutdown()
    assert p.returncode == 0, err.decode()[-3000:]
    assert TOKEN.encode() not in cmdline
    assert TOKEN.encode() not in err and b"event=notification_sent" in err, err[-2000:]
    assert b"event=notify_rate_limited" in err

    for h in (slack_hook, json_hook):
        bodies = [b for _, b in h.accepted()]
        digests = [b for b in bodies if "more decision" in json.dumps(b)[:400]
                   or b.get("digest")]
        stamps = sorted(t for t, _ in h.accepted())
        span_s = stamps[-1] - stamps[0]
        print(f"posts to one webhook for {STORM} decisions: {len(bodies)} "
              f"({len(digests)} digest(s)) over {span_s:.1f}s")
        # the bucket holds PER_HOOK posts and refills PER_HOOK a minute: a storm that lasts
        # longer (10,000 decisions on a loaded machine) may post a few more, never a flood
        assert len(bodies) - len(digests) <= PER_HOOK * (1 + span_s / 60) + 1, len(bodies)
        assert 1 <= len(digests) <= 2 + span_s / DIGEST_S, len(digests)
        # 0.2 s apart (arrival times jitter with the receiver's threads: the span is checked)
        assert stamps[-1] - stamps[0] >= 0.2 * (len(stamps) - 1) * 0.9, stamps
    js = [b for _, b in json_hook.accepted()]
    dgs = [b for b in js if b.get("digest")]  # one, or two when the storm outlasts 3 s
    assert sum(d["decisions"] for d in dgs) == \
        STORM - sum(len(b["new_ids"]) for b in js if not b.get("digest"))
    assert set().union(*(d["by_kind"] for d in dgs)) == {"hang", "error"}

    slack_text = json.dumps([b for _, b in slack_hook.accepted()])
    assert "&lt;!channel&gt;" in slack_text  # the hostile job was posted (positive control)
    for raw in ("<!channel>", "<!here>", "<@U024BE7LH>", "<https://", "https://evil",
                "``` <"):
        assert raw not in slack_text, raw
