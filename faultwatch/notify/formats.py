"""Webhook bodies for one notification: generic JSON, Slack, Feishu/Lark and DingTalk."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from typing import Any

from faultwatch.notify import escape
from faultwatch.notify.grouping import Notification, label_of
from faultwatch.notify.limit import Digest

FORMATS = ("json", "slack", "feishu", "dingtalk")
_MAX_LINE_CHARS = 300


Esc = Callable[[object], str]


def title(n: Notification, esc: Esc = escape.text) -> str:
    """`[faultwatch] job=j kind=hang: 12 decisions (restart x12)`; labels escaped by `esc`."""
    actions = Counter(label_of(d, "action") for d in n.decisions)
    what = ", ".join(f"{esc(a)} x{c}" for a, c in sorted(actions.items()))
    again = {"update": " (update)", "repeat": " (still firing)"}.get(n.reason, "")
    key = ",".join(f"{k}={esc(v)}" for k, v in n.labels.items())
    return f"[faultwatch] {key}: {n.firing} decision(s) ({what}){again}"


def _line(d: dict[str, Any], new: bool, esc: Esc) -> str:
    reason_ = d.get("reason")
    reason: dict[str, Any] = reason_ if isinstance(reason_, dict) else {}
    targets = d.get("targets")
    nodes = targets.get("nodes") if isinstance(targets, dict) else []
    msg = str(reason.get("message") or reason.get("rule") or "")[:_MAX_LINE_CHARS]
    mark = "NEW " if new else ""
    when = time.strftime("%H:%M:%S", time.gmtime(float(d.get("ts") or 0)))
    return (f"{mark}{when}Z {esc(d.get('action'))} job={esc(d.get('job'))} "
            f"attempt={esc(d.get('attempt'))} kind={esc(reason.get('kind'))} "
            f"nodes={esc(','.join(map(str, nodes or [])) or '-')}"
            + (f": {esc(msg)}" if msg else ""))


def lines(n: Notification, esc: Esc = escape.text) -> list[str]:
    """One line per decision shown, and how many are not shown."""
    out = [_line(d, str(d.get("id")) in n.new_ids, esc) for d in n.decisions]
    hidden = n.firing - len(n.decisions)
    return out + ([f"... and {hidden} more"] if hidden > 0 else [])


def text(n: Notification, esc: Esc = escape.text) -> str:
    """The plain-text body: a title line and one line per decision shown."""
    return "\n".join([title(n, esc), *lines(n, esc)])


def generic(n: Notification) -> dict[str, Any]:
    return {"version": 1, "source": "faultwatch", "group_key": n.key, "labels": n.labels,
            "reason": n.reason, "firing": n.firing, "total": n.total,
            "new_ids": sorted(n.new_ids), "decisions": list(n.decisions), "title": title(n),
            "text": text(n)}


def slack(n: Notification) -> dict[str, Any]:
    """Title as mrkdwn text, the decisions in a code block (backticks cannot close it)."""
    block = "\n".join(lines(n, escape.slack_code))[:2900]
    return {"text": title(n, escape.slack),
            "blocks": [{"type": "section", "text": {"type": "mrkdwn",
                                                    "text": title(n, escape.slack)}},
                       {"type": "section", "text": {"type": "mrkdwn",
                                                    "text": "```" + block + "```"}}]}


def feishu(n: Notification, secret: str | None = None, now: float | None = None
           ) -> dict[str, Any]:
    """A Feishu/Lark custom-bot text message; signed (timestamp + sign) when the bot has a
    secret: base64(HMAC-SHA256(key="<ts>\\n<secret>", message=""))."""
    body: dict[str, Any] = {"msg_type": "text",
                            "content": {"text": text(n, escape.feishu)}}
    return _feishu_sign(body, secret, now)


def _feishu_sign(body: dict[str, Any], secret: str | None, now: float | None = None
                 ) -> dict[str, Any]:
    if secret:
        ts = str(int(now if now is not None else time.time()))
        mac = hmac.new(f"{ts}\n{secret}".encode(), b"", hashlib.sha256).digest()
        body.update(timestamp=ts, sign=base64.b64encode(mac).decode())
    return body


def dingtalk(n: Notification) -> dict[str, Any]:
    head = title(n, escape.markdown)
    return {"msgtype": "markdown",
            "markdown": {"title": head[:60],
                         "text": f"#### {head}\n\n" + "\n\n".join(
                             "- " + line for line in lines(n, escape.markdown))}}


def dingtalk_url(url: str, secret: str | None, now: float | None = None) -> str:
    """DingTalk signs in the URL: &timestamp=<ms>&sign=urlencode(base64(HMAC-SHA256(
    key=secret, message="<ms>\\n<secret>")))."""
    if not secret:
        return url
    ms = str(int((now if now is not None else time.time()) * 1000))
    mac = hmac.new(secret.encode(), f"{ms}\n{secret}".encode(), hashlib.sha256).digest()
    sign = urllib.parse.quote_plus(base64.b64encode(mac).decode())
    return f"{url}{'&' if '?' in url else '?'}timestamp={ms}&sign={sign}"


def digest_title(dg: Digest) -> str:
    span = max(1, round(dg.now - dg.since))
    return (f"[faultwatch] {dg.decisions} more decision(s) in the last {span} s "
            f"(rate limit: {dg.messages} message(s) held back)")


def digest_lines(dg: Digest, esc: Esc = escape.text) -> list[str]:
    out = []
    for what, c in (("kind", dg.by_kind), ("job", dg.by_job)):
        top, rest = Digest.top(c)
        shown = ", ".join(f"{esc(k)} {v}" for k, v in top)
        out.append(f"by {what}: {shown}" + (f" (+{rest} more)" if rest else ""))
    return out


def digest_body(fmt: str, dg: Digest, secret: str | None = None) -> dict[str, Any]:
    """A digest in `fmt`: how many decisions were held back, by kind and by job."""
    if fmt == "json":
        return {"version": 1, "source": "faultwatch", "digest": True,
                "decisions": dg.decisions, "messages": dg.messages, "since": dg.since,
                "by_kind": dict(dg.by_kind), "by_job": dict(dg.by_job),
                "title": digest_title(dg),
                "text": "\n".join([digest_title(dg), *digest_lines(dg)])}
    if fmt == "slack":
        return {"text": digest_title(dg),
                "blocks": [{"type": "section", "text": {
                    "type": "mrkdwn", "text": "\n".join(
                        [digest_title(dg), *digest_lines(dg, escape.slack)])[:2900]}}]}
    if fmt == "feishu":
        body: dict[str, Any] = {"msg_type": "text", "content": {"text": "\n".join(
            [digest_title(dg), *digest_lines(dg, escape.feishu)])}}
        return _feishu_sign(body, secret)
    if fmt == "dingtalk":
        return {"msgtype": "markdown",
                "markdown": {"title": digest_title(dg)[:60],
                             "text": f"#### {digest_title(dg)}\n\n" + "\n\n".join(
                                 "- " + x for x in digest_lines(dg, escape.markdown))}}
    raise ValueError(f"unknown webhook format {fmt!r}; choose from {', '.join(FORMATS)}")


def body(fmt: str, n: Notification | Digest, secret: str | None = None) -> dict[str, Any]:
    """The JSON body of `fmt` for a notification or a digest."""
    if isinstance(n, Digest):
        return digest_body(fmt, n, secret)
    if fmt == "json":
        return generic(n)
    if fmt == "slack":
        return slack(n)
    if fmt == "feishu":
        return feishu(n, secret)
    if fmt == "dingtalk":
        return dingtalk(n)
    raise ValueError(f"unknown webhook format {fmt!r}; choose from {', '.join(FORMATS)}")


def accepted(fmt: str, status: int, response: Any) -> bool:
    """Whether the receiver took the message: 2xx, and for Feishu/DingTalk a zero code in
    the JSON answer (they answer 200 with an error code when they refuse)."""
    if not 200 <= status < 300:
        return False
    if fmt == "feishu" and isinstance(response, dict):
        return response.get("code", response.get("StatusCode", 0)) == 0
    if fmt == "dingtalk" and isinstance(response, dict):
        return response.get("errcode", 0) == 0
    return True
