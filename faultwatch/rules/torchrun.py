"""Parses torchrun's ChildFailedError summary into per-rank exit codes and signals."""

from __future__ import annotations

import re
from collections.abc import Sequence

from faultwatch.rules.model import RankFailure
from faultwatch.rules.normalise import normalise_line

CHILD_FAILED = "ChildFailedError"
_ENTRY = re.compile(r"\s*\[(\d+)\]:\s*$")
_FIELD = re.compile(r"\s*(time|host|rank|exitcode|error_file|traceback|msg)\s*:\s*(.*?)\s*$")
_RANK = re.compile(r"(-?\d+)(?:\s*\(local_rank:\s*(-?\d+)\))?")
_EXIT = re.compile(r"(-?\d+)")
_SIGNAL = re.compile(r"Signal (\d+) \((SIG\w+)\) received")
_MAX_LINES = 400


def _entry(fields: dict[str, str], root: bool) -> RankFailure:
    rank = local = code = sig = None
    if m := _RANK.match(fields.get("rank", "")):
        rank = int(m.group(1))
        local = int(m.group(2)) if m.group(2) is not None else None
    if m := _EXIT.match(fields.get("exitcode", "")):
        code = int(m.group(1))
        if code < 0:
            sig = -code
    if m := _SIGNAL.search(fields.get("traceback", "") + " " + fields.get("msg", "")):
        sig = int(m.group(1))
    return RankFailure(rank, local, code, sig, fields.get("host"), fields.get("time"), root)


def parse_child_failed(lines: Sequence[str]) -> list[RankFailure]:
    """Every failure listed after a `ChildFailedError` line (root cause entries flagged).

    The root cause is only torchrun's *first observed* failure — in a hang it is a waiting
    rank, not the culprit — so callers must not treat it as the culprit.
    """
    out: list[RankFailure] = []
    i, n = 0, len(lines)
    while i < n:
        if CHILD_FAILED not in lines[i]:
            i += 1
            continue
        root = False
        fields: dict[str, str] | None = None
        end = min(n, i + _MAX_LINES)
        i += 1
        while i < end:
            text = normalise_line(lines[i]).text
            if CHILD_FAILED in text or "Traceback (most recent call last)" in text:
                break
            if text.strip().startswith("Root Cause"):
                if fields is not None:
                    out.append(_entry(fields, root))
                    fields = None
                root = True
            elif text.strip().startswith(("Other Failures", "Failures:")):
                if fields is not None:
                    out.append(_entry(fields, root))
                    fields = None
                root = False
            elif _ENTRY.match(text):
                if fields is not None:
                    out.append(_entry(fields, root))
                fields = {}
            elif fields is not None and (m := _FIELD.match(text)):
                fields[m.group(1)] = m.group(2)
            i += 1
        if fields is not None:
            out.append(_entry(fields, root))
    return out
