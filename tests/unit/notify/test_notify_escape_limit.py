"""Escaping per sink and the rate limiter with digests (pure, time passed in)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faultwatch.notify import escape, formats
from faultwatch.notify.grouping import Notification
from faultwatch.notify.limit import Limiter, RateLimits
from faultwatch.notify.sender import Receiver, redact

HOSTILE = "<!channel> <https://evil.example/login|Click> <@U1> @here `x` [a](http://b) \u202e"


def note(job: str, kind: str = "error", n: int = 1, msg: str = "boom") -> Notification:
    ds = tuple({"id": f"{job}/{i}", "job": job, "action": "restart", "attempt": 0,
                "reason": {"kind": kind, "message": msg}, "targets": {"nodes": ["n1"]},
                "ts": 0} for i in range(n))
    return Notification(labels={"job": job, "kind": kind}, reason="initial", decisions=ds,
                        new_ids=frozenset(str(d["id"]) for d in ds), firing=n, total=n,
                        first_ts=0.0, now=0.0)


@pytest.mark.parametrize("fmt", ["slack", "feishu", "dingtalk", "json"])
def test_no_sink_carries_a_mention_a_link_or_a_bidi_override(fmt: str) -> None:
    b = formats.body(fmt, note(HOSTILE, msg=HOSTILE))
    if fmt == "json":  # the decisions stay data for programs; the text fields are for people
        b = {"title": b["title"], "text": b["text"]}
    body = json.dumps(b, ensure_ascii=False)
    for raw in ("<!channel>", "<@U1>", "<https://", "https://evil", "http://b", "@here",
                "\u202e"):
        assert raw not in body, (fmt, raw)
    assert "evil.example" in body  # the text is still there to read


def test_slack_escapes_its_control_characters_and_code_spans_cannot_close() -> None:
    assert escape.slack("a & <b>") == "a &amp; &lt;b&gt;"
    block = formats.slack(note("j", msg="``` <!here> ```"))["blocks"][1]["text"]["text"]
    assert block.startswith("```") and block.endswith("```") and block.count("```") == 2


def test_redact_keeps_scheme_and_host_only() -> None:
    assert redact("https://hooks.slack.com/services/T/B/tok") == "https://hooks.slack.com"
    assert redact("http://127.0.0.1:8080/hook/x?t=1") == "http://127.0.0.1:8080"
    assert "tok" not in repr(Receiver("https://h/services/tok", "slack"))


def test_a_storm_becomes_the_limit_then_one_digest_by_kind_and_job() -> None:
    lim = Limiter(RateLimits(per_webhook_per_min=5, total_per_min=100, digest_interval_s=60),
                  now=0.0)
    admitted = [lim.admit("0", note(f"j{i}", ("hang", "error")[i % 2]), 1.0)
                for i in range(100)]
    assert sum(admitted) == 5
    assert lim.due_digests(30.0) == []
    [(hook, dg)] = lim.due_digests(61.0)
    assert hook == "0" and dg.decisions == 95 and dg.messages == 95
    assert dg.by_kind == {"hang": 47, "error": 48} and len(dg.by_job) == 95
    text = formats.body("slack", dg)["text"]
    assert text.startswith("[faultwatch] 95 more decision(s) in the last 60 s")
    assert lim.admit("0", note("later"), 61.0 + 12.0)  # tokens refill: 5 a minute


def test_the_total_limit_is_shared_by_all_webhooks() -> None:
    lim = Limiter(RateLimits(per_webhook_per_min=10, total_per_min=12), now=0.0)
    got = [lim.admit(h, note(f"{h}{i}"), 0.0) for i in range(10) for h in ("a", "b")]
    assert sum(got) == 12


def test_posts_to_one_webhook_are_spaced() -> None:
    lim = Limiter(RateLimits(min_gap_s=1.0), now=0.0)
    assert lim.send_at("a", 5.0) == 5.0
    lim.sending("a", 5.0)
    assert lim.send_at("a", 5.2) == 6.0 and lim.send_at("b", 5.2) == 5.2


@pytest.mark.parametrize("spec, part, secret", [
    ("slack=https://hooks.slack.com/services/T0/B0/tok3n", "'/services/'", "tok3n"),
    ("feishu=https://open.feishu.cn/open-apis/bot/v2/hook/5d7e-11", "'/hook/'", "5d7e-11"),
    ("dingtalk=https://oapi.dingtalk.com/robot/send?access_token=abc9", "'access_token'", "abc9"),
    ("https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=693a", "'key'", "693a"),
    ("https://discord.com/api/webhooks/123/t0ken", "'/webhooks/'", "t0ken"),
    ("https://user:pw9@hooks.example/x", "password", "pw9"),
    # Mattermost and Rocket.Chat incoming webhooks, Teams connectors, Telegram bots
    ("https://mm.example.com/hooks/xi3nn9qm6jf5zbx7ur5xhwb8me", "'/hooks/'",
     "xi3nn9qm6jf5zbx7ur5xhwb8me"),
    ("https://rc.example.com/hooks/5e4a/ABCDEFG123", "'/hooks/'", "ABCDEFG123"),
    ("https://acme.webhook.office.com/webhookb2/3f1c2a2e-1111@aaaa/IncomingWebhook/ab/cd",
     "'/webhookb2/'", "3f1c2a2e-1111"),
    ("https://api.telegram.org/bot123456:ABC-DEF1234ghIkl/sendMessage", "bot token",
     "ABC-DEF1234ghIkl"),
    ("https://prod-1.logic.azure.com/workflows/w/invoke?api-version=2016-06-01&sig=Z9x",
     "'sig'", "Z9x"),
    ("https://tok9@hooks.example/x", "user name", "tok9"),
    # the general case: a path segment or query value that looks like a token
    ("https://alerts.example.com/notify/9f86d081884c7d659a2feaa0c55ad015", "path segment",
     "9f86d081884c7d659a2feaa0c55ad015"),
    ("https://alerts.example.com/post?channel=ops&c=Ab12Cd34Ef56Gh78", "query parameter 'c'",
     "Ab12Cd34Ef56Gh78"),
])
def test_a_webhook_flag_that_holds_a_token_is_refused(spec: str, part: str, secret: str) -> None:
    import argparse

    from faultwatch.cli.notify import webhook_specs
    from faultwatch.errors import ConfigError
    from faultwatch.notify.sender import holds_token

    assert part in (holds_token(spec) or "")
    args = argparse.Namespace(webhook=[spec], webhook_file=[])
    with pytest.raises(ConfigError, match="--webhook-file") as err:
        webhook_specs(args)
    assert secret not in str(err.value)  # the refusal does not print what it protects


def test_a_webhook_flag_without_a_token_and_any_webhook_file_are_taken(tmp_path: Path) -> None:
    import argparse

    from faultwatch.cli.notify import webhook_specs
    from faultwatch.notify.sender import holds_token

    plain = ["http://127.0.0.1:9/x", "slack=http://alerts.internal:8080/post", "https://h/",
             "https://ops.example.com/api/v2/faultwatch-notifications?channel=ml-ops"]
    assert [holds_token(s) for s in plain] == [None, None, None, None]
    hooks = tmp_path / "hooks"
    hooks.write_text("slack=https://hooks.slack.com/services/T0/B0/tok\n")
    args = argparse.Namespace(webhook=plain, webhook_file=[hooks])
    assert webhook_specs(args) == [*plain, "slack=https://hooks.slack.com/services/T0/B0/tok"]
