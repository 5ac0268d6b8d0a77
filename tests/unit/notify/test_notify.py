"""Notification grouping (Alertmanager timers, time passed in), bodies and backoff."""

from __future__ import annotations

import base64
import hashlib
import hmac
import urllib.parse
from typing import Any

import pytest

from faultwatch.notify import formats
from faultwatch.notify.grouping import Grouper, GroupingPolicy, Notification
from faultwatch.notify.sender import Receiver, RetryPolicy

POLICY = GroupingPolicy(group_wait_s=30, group_interval_s=300, repeat_interval_s=3600,
                        resolve_timeout_s=600, max_decisions_per_message=5)


def dec(i: int, job: str = "j1", kind: str = "error", action: str = "restart") -> dict[str, Any]:
    return {"v": 1, "id": f"{job}/{i}/{action}/{kind}", "job": job, "attempt": i,
            "action": action, "targets": {"nodes": ["n1"], "ranks": []},
            "reason": {"kind": kind, "rule": "nccl.timeout", "category": "retryable",
                       "message": "NCCL watchdog timeout"},
            "evidence": {}, "budgets": {}, "rules_version": "", "ts": 1763850000.0 + i}


def test_a_storm_sends_one_message_after_group_wait_then_follow_ups() -> None:
    g = Grouper(POLICY)
    for i in range(100):
        g.add(dec(i), now=1000 + i * 0.1)
    assert g.due(1029.9) == []  # group_wait not over
    [first] = g.due(1030.0)
    assert (first.reason, first.firing, first.total, len(first.new_ids)) == ("initial", 100,
                                                                             100, 100)
    assert len(first.decisions) == 5 and first.decisions[-1]["id"] == "j1/99/restart/error"
    assert first.labels == {"job": "j1", "kind": "error"}
    for i in range(100, 110):
        g.add(dec(i), now=1100)
    assert g.due(1329.9) == []  # group_interval not over
    [update] = g.due(1330.0)
    assert update.reason == "update" and len(update.new_ids) == 10 and update.total == 110
    assert g.due(1630.0) == []  # nothing new, repeat_interval not reached


def test_groups_are_by_job_and_kind_and_duplicates_are_ignored() -> None:
    g = Grouper(POLICY)
    assert g.add(dec(1, "a", "error"), 0) and not g.add(dec(1, "a", "error"), 1)
    g.add(dec(2, "a", "hang"), 0)
    g.add(dec(3, "b", "error"), 10)
    notes = g.due(30)
    assert sorted(n.key for n in notes) == ["job=a,kind=error", "job=a,kind=hang"]
    assert [n.key for n in g.due(40)] == ["job=b,kind=error"]
    assert len(g) == 3


def test_repeat_after_repeat_interval_while_firing_then_the_group_ends() -> None:
    p = GroupingPolicy(group_wait_s=0, group_interval_s=60, repeat_interval_s=120,
                       resolve_timeout_s=200)
    g = Grouper(p)
    g.add(dec(1, action="fail"), 0)
    assert [n.reason for n in g.due(0)] == ["initial"]
    assert g.due(60) == []
    [again] = g.due(120)
    assert again.reason == "repeat" and again.new_ids == frozenset()
    assert g.due(180) == []
    assert g.due(240) == [] and len(g) == 0  # resolved (arrived + 200 <= 240): group gone
    assert g.next_due() is None


def test_unsent_decisions_are_pending_until_their_message_is_due() -> None:
    g = Grouper(POLICY)
    g.add(dec(1), 0)
    assert g.pending_ids() == {"j1/1/restart/error"} and g.next_due() == 30
    g.due(30)
    assert g.pending_ids() == set()


@pytest.mark.parametrize("kw", [{"group_by": ("host",)}, {"group_interval_s": 0},
                                {"group_wait_s": -1}, {"max_decisions_per_message": 0}])
def test_bad_policies_are_refused(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        GroupingPolicy(**kw)


def note(n: int = 3) -> Notification:
    g = Grouper(POLICY)
    for i in range(n):
        g.add(dec(i), 0)
    [out] = g.due(30)
    return out


def test_bodies_of_every_format() -> None:
    n = note(7)
    generic = formats.body("json", n)
    assert generic["group_key"] == "job=j1,kind=error" and generic["firing"] == 7
    assert len(generic["decisions"]) == 5 and "... and 2 more" in generic["text"]
    assert formats.body("slack", n)["text"].startswith("[faultwatch] job=j1,kind=error: 7")
    assert formats.body("feishu", n)["msg_type"] == "text"
    ding = formats.body("dingtalk", n)
    assert ding["msgtype"] == "markdown" and "NCCL watchdog timeout" in ding["markdown"]["text"]
    with pytest.raises(ValueError):
        formats.body("teams", n)


def test_feishu_and_dingtalk_signatures_follow_their_documented_recipes() -> None:
    body = formats.feishu(note(), secret="s3cret", now=1700000000)
    want = hmac.new(b"1700000000\ns3cret", b"", hashlib.sha256).digest()
    assert body["timestamp"] == "1700000000" and base64.b64decode(body["sign"]) == want
    url = formats.dingtalk_url("https://oapi.dingtalk.com/robot/send?access_token=t", "s3cret",
                               now=1700000000.5)
    q = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    want = hmac.new(b"s3cret", b"1700000000500\ns3cret", hashlib.sha256).digest()
    assert q["timestamp"] == ["1700000000500"] and base64.b64decode(q["sign"][0]) == want


def test_chat_bots_that_answer_200_with_an_error_code_did_not_accept() -> None:
    assert not formats.accepted("feishu", 200, {"code": 19021, "msg": "sign match fail"})
    assert not formats.accepted("dingtalk", 200, {"errcode": 310000})
    assert formats.accepted("dingtalk", 200, {"errcode": 0})
    assert not formats.accepted("json", 500, None)


def test_backoff_doubles_up_to_the_cap_and_honours_retry_after() -> None:
    r = RetryPolicy(base_s=1, factor=2, max_s=10)
    assert [r.delay_s(k) for k in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert r.delay_s(1, retry_after_s=5) == 5 and r.delay_s(1, retry_after_s=99) == 10


def test_receivers_parse_format_and_hide_the_token() -> None:
    r = Receiver.parse("dingtalk=https://oapi.dingtalk.com/robot/send?access_token=t")
    assert r.fmt == "dingtalk" and r.where == "https://oapi.dingtalk.com"  # scheme, host
    assert Receiver.parse("http://h/x?a=b").fmt == "json"
    with pytest.raises(Exception, match="http"):
        Receiver.parse("slack=ftp://x")


def test_offsets_are_committed_only_past_delivered_decisions() -> None:
    from collections import namedtuple

    import orjson

    from faultwatch.notify.service import Notifier, NotifierConfig
    from faultwatch.trust.records import DecisionGate

    TP = namedtuple("TP", "topic partition")
    tp = TP("p.decisions", 0)
    clock = [0.0]
    n = Notifier(NotifierConfig("b:1", tp.topic, (Receiver("http://h/x"),), policy=POLICY),
                 DecisionGate(None, lambda e, **f: None), lambda e, **f: None,
                 clock=lambda: clock[0])
    for i in range(3):  # stamped at the notifier's clock (the replay rule's age limit)
        n.take(orjson.dumps({**dec(i), "ts": clock[0]}), tp, 10 + i)
    n.take(b"not json", tp, 13)  # undecodable: logged, never blocks the commit
    assert n.committable({tp: 14}) == {tp: 10}  # all three wait for their message
    n.grouper.due(30.0)  # sent (deliveries finished)
    assert n.committable({tp: 14}) == {tp: 14}


def test_a_probe_on_the_decisions_topic_is_never_a_message() -> None:
    """An older processor (or `process --probes-on-decisions`) puts its stack probes (`notify`
    of kind `diagnose`) on the decisions topic: `faultwatch notify` drops them, the hang
    decision that names them is the one message (issue 21 item 2; docs/decisions.md)."""
    from collections import namedtuple

    import orjson

    from faultwatch.notify.service import Notifier, NotifierConfig
    from faultwatch.trust.records import DecisionGate

    TP = namedtuple("TP", "topic partition")
    tp = TP("p.decisions", 0)
    n = Notifier(NotifierConfig("b:1", tp.topic, (Receiver("http://h/x"),), policy=POLICY),
                 DecisionGate(None, lambda e, **f: None), lambda e, **f: None,
                 clock=lambda: 0.0)
    for i in range(3):
        n.take(orjson.dumps({**dec(i, kind="diagnose", action="notify"), "ts": 0.0}), tp, i)
    n.take(orjson.dumps({**dec(3, kind="hang"), "ts": 0.0}), tp, 3)  # positive control
    sent = n.grouper.due(30.0)
    assert [[d["reason"]["kind"] for d in note.decisions] for note in sent] == [["hang"]]
