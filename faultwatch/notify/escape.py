"""Text from jobs (names, matched log lines) made inert for each sink people read.

Job names and log lines are written by whoever runs a job. A chat sink must show them as
text: no mention that pings a channel, no link (disguised or bare), no markup that changes
what the message says. Every sink gets `plain` first (control and bidirectional-override
characters removed, so a line cannot reorder or hide the text around it); then its own rules:

- Slack mrkdwn: `&`, `<`, `>` become `&amp;`, `&lt;`, `&gt;` (Slack's own escaping: `<!channel>`,
  `<@U123>` and `<url|text>` stay text), `@` is followed by a word joiner (no `@here`),
  `://` is broken (no auto-link); text shown in a code span has its backticks replaced.
- Feishu/Lark text: `<` and `>` become their full-width forms (no `<at user_id="all">`), no
  auto-link, no `@` mention.
- DingTalk markdown: markdown punctuation becomes full-width (no `[text](url)`, no emphasis,
  no heading), no auto-link, no `@` mention.
- Generic JSON: the encoder escapes JSON; the `title` and `text` fields get Feishu's rules
  (receivers often relay them to a chat); `decisions` and `labels` stay unchanged data.
"""

from __future__ import annotations

import re

WORD_JOINER = "\u2060"  # invisible, breaks a token without a visible space
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_SCHEME = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,20}):(//)")
_WWW = re.compile(r"(?i)\bwww\.")
_AT = re.compile(r"@(?=\S)")


def plain(s: object) -> str:
    """Any value as one safe line of text: no control or bidi-override characters."""
    return _CONTROL.sub("", str(s)).replace("\n", " ").replace("\t", " ")


def no_links(s: str) -> str:
    """Break `scheme://` and `www.` so no sink turns them into a link."""
    s = _SCHEME.sub(lambda m: f"{m.group(1)}:{WORD_JOINER}//", s)
    return _WWW.sub(lambda m: m.group(0)[:3] + WORD_JOINER + ".", s)


def no_mentions(s: str) -> str:
    return _AT.sub("@" + WORD_JOINER, s)


def slack(s: object) -> str:
    """Text from a job inside Slack mrkdwn."""
    t = plain(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return no_mentions(no_links(t))


def slack_code(s: object) -> str:
    """Text shown inside a Slack code span or block: escaped, and no backtick can close it."""
    return slack(s).replace("`", "\u02cb")


def feishu(s: object) -> str:
    return no_mentions(no_links(plain(s).replace("<", "\uff1c").replace(">", "\uff1e")))


_MD = str.maketrans({"[": "\uff3b", "]": "\uff3d", "(": "\uff08", ")": "\uff09",
                     "<": "\uff1c", ">": "\uff1e", "*": "\uff0a", "_": "\uff3f",
                     "#": "\uff03", "`": "\u02cb", "!": "\uff01", "|": "\uff5c",
                     "~": "\uff5e"})


def markdown(s: object) -> str:
    """Text from a job inside DingTalk (or any) markdown: no markup, links or mentions."""
    return no_mentions(no_links(plain(s).translate(_MD)))


def text(s: object) -> str:
    """The `title` and `text` fields of the generic JSON body (receivers often relay them
    to a chat): as for Feishu. The `decisions` and `labels` fields stay data, unchanged."""
    return feishu(s)
