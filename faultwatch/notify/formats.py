"""Webhook bodies for one notification: generic JSON, Slack, Feishu/Lark and DingTalk."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import urllib.parse
from collections import Counter
from typing import Any

from faultwatch.notify.grouping import Notification, label_of

FORMATS = ("json", "slack", "feishu", "dingtalk")
_MAX_LINE_CHARS = 300


def title(n: Notification) -> str:
    """`[faultwatch] job=j kind=hang: 12 decisions (restart x12)`."""
    actions = Counter(label_of(d, "action") for d in n.decisions)
    what = ", ".join(f"{a} x{c}" for a, c in sorted(actions.items()))
    again = {"update": " (update)", "repeat": " (still firing)"}.get(n.reason, "")
    return f"[faultwatch] {n.key}: {n.firing} decision(s) ({what}){again}"


def _line(d: dict[str, Any], new: bool) -> str:
    reason_ = d.get("reason")
    reason: dict[str, Any] = reason_ if isinstance(reason_, dict) else {}
    targets = d.get("targets")
    nodes = targets.get("nodes") if isinstance(targets, dict) else []
    msg = str(reason.get("message") or reason.get("rule") or "")[:_MAX_LINE_CHARS]
    mark = "NEW " if new else ""
    when = time.strftime("%H:%M:%S", time.gmtime(float(d.get("ts") or 0)))
    return (f"{mark}{when}Z {d.get('action')} job={d.get('job')} attempt={d.get('attempt')} "
            f"kind={reason.get('kind')} nodes={','.join(map(str, nodes or [])) or '-'}"
            + (f": {msg}" if msg else ""))


def text(n: Notification) -> str:
    """The plain-text body: a title line and one line per decision shown."""
    lines = [_line(d, str(d.get("id")) in n.new_ids) for d in n.decisions]
    hidden = n.firing - len(n.decisions)
    more = [f"... and {hidden} more"] if hidden > 0 else []
    return "\n".join([title(n), *lines, *more])


def generic(n: Notification) -> dict[str, Any]:
    return {"version": 1, "source": "faultwatch", "group_key": n.key, "labels": n.labels,
            "reason": n.reason, "firing": n.firing, "total": n.total,
            "new_ids": sorted(n.new_ids), "decisions": list(n.decisions), "title": title(n),
            "text": text(n)}


def slack(n: Notification) -> dict[str, Any]:
    return {"text": title(n),
            "blocks": [{"type": "section", "text": {"type": "mrkdwn",
                                                    "text": "```" + text(n)[:2900] + "```"}}]}


def feishu(n: Notification, secret: str | None = None, now: float | None = None
           ) -> dict[str, Any]:
    """A Feishu/Lark custom-bot text message; signed (timestamp + sign) when the bot has a
    secret: base64(HMAC-SHA256(key="<ts>\\n<secret>", message=""))."""
    body: dict[str, Any] = {"msg_type": "text", "content": {"text": text(n)}}
    if secret:
        ts = str(int(now if now is not None else time.time()))
        mac = hmac.new(f"{ts}\n{secret}".encode(), b"", hashlib.sha256).digest()
        body.update(timestamp=ts, sign=base64.b64encode(mac).decode())
    return body


def dingtalk(n: Notification) -> dict[str, Any]:
    return {"msgtype": "markdown",
            "markdown": {"title": title(n)[:60],
                         "text": f"#### {title(n)}\n\n" + "\n\n".join(
                             "- " + line for line in text(n).splitlines()[1:])}}


def dingtalk_url(url: str, secret: str | None, now: float | None = None) -> str:
    """DingTalk signs in the URL: &timestamp=<ms>&sign=urlencode(base64(HMAC-SHA256(
    key=secret, message="<ms>\\n<secret>")))."""
    if not secret:
        return url
    ms = str(int((now if now is not None else time.time()) * 1000))
    mac = hmac.new(secret.encode(), f"{ms}\n{secret}".encode(), hashlib.sha256).digest()
    sign = urllib.parse.quote_plus(base64.b64encode(mac).decode())
    return f"{url}{'&' if '?' in url else '?'}timestamp={ms}&sign={sign}"


def body(fmt: str, n: Notification, secret: str | None = None) -> dict[str, Any]:
    """The JSON body of `fmt` for a notification."""
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
