"""What `faultwatch logs` and `faultwatch decisions` keep (pure: time passed in): the
`--since`/`--until` times, the filters of shipped lines and of decisions."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Collection
from dataclasses import dataclass

from faultwatch.core.events import Decision
from faultwatch.errors import UsageError
from faultwatch.readers.timeline import LINE, Row

_UNITS_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = r"(\d+(?:\.\d+)?)([smhd])"
_SPAN = re.compile(rf"(?:{_PART})+")  # 90s, 30m, 2h, 1d, 1h30m


def span_s(text: str) -> float | None:
    """The one duration grammar: `90s`, `30m`, `2h`, `1d`, `1h30m` (any case) as seconds;
    None when `text` is not one (a bare number is the caller's to read)."""
    t = text.strip().lower()
    if _SPAN.fullmatch(t) is None:
        return None
    return sum(float(n) * _UNITS_S[u] for n, u in re.findall(_PART, t))



def parse_when(text: str, now: float, flag: str = "--since") -> float:
    """A point in time as Unix seconds: `10m`, `2h`, `1d`, `90s` (that long before `now`),
    an ISO 8601 date and time (`2026-11-26T14:05:00`, a space for the T, `Z` or an offset;
    without one, the local time zone), or Unix seconds (`1764165900.5`). UsageError (exit 2)
    naming the flag otherwise."""
    s = text.strip()
    ago = span_s(s)
    if ago is not None:
        return now - ago
    try:
        return float(s)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(s[:-1] + "+00:00" if s.endswith(("Z", "z")) else s)
    except ValueError:
        raise UsageError(f"{flag} {text!r}: not a time (10m, 2h, 1d, an ISO 8601 time such as "
                         "2026-11-26T14:05:00, or Unix seconds)") from None
    return when.timestamp()  # naive: the local time zone


def grep_pattern(text: str | None) -> re.Pattern[str] | None:
    """`--grep REGEX` compiled (Python `re` syntax); UsageError (exit 2) when invalid."""
    if text is None:
        return None
    try:
        return re.compile(text)
    except re.error as e:
        raise UsageError(f"--grep {text!r}: not a regular expression: {e}") from None


@dataclass(frozen=True)
class LogFilter:
    """Which rows `faultwatch logs` prints. Empty sets and None mean "any".

    Line rows pass every filter. Rows that belong to the whole job (attempt separators,
    decisions) pass only the run, attempt and time filters, so a `--node`, `--rank` or
    `--grep` view still shows where attempts start and why; an exit row is a node's, so it
    passes the node filter too."""

    nodes: frozenset[str] = frozenset()
    ranks: frozenset[int] = frozenset()
    attempts: frozenset[int] = frozenset()
    run_id: str | None = None
    streams: frozenset[str] = frozenset()
    since: float | None = None
    until: float | None = None
    grep: re.Pattern[str] | None = None

    def keeps(self, row: Row) -> bool:
        if self.run_id is not None and row.run_id != self.run_id:
            return False
        if self.attempts and row.attempt not in self.attempts:
            return False
        if self.since is not None and row.ts < self.since:
            return False
        if self.until is not None and row.ts > self.until:
            return False
        if row.kind == "exit" and self.nodes and row.node not in self.nodes:
            return False
        if row.kind != LINE:
            return True
        if self.nodes and row.node not in self.nodes:
            return False
        if self.ranks and row.rank not in self.ranks:
            return False
        if self.streams and row.stream not in self.streams:
            return False
        return self.grep is None or self.grep.search(row.text) is not None


@dataclass(frozen=True)
class DecisionFilter:
    """Which decisions `faultwatch decisions` prints. Empty sets and None mean "any"."""

    job: str | None = None
    actions: frozenset[str] = frozenset()
    kinds: frozenset[str] = frozenset()
    since: float | None = None
    until: float | None = None

    def keeps(self, dec: Decision) -> bool:
        return ((self.job is None or dec.job == self.job)
                and (not self.actions or dec.action in self.actions)
                and (not self.kinds or dec.kind in self.kinds)
                and (self.since is None or dec.ts >= self.since)
                and (self.until is None or dec.ts <= self.until))


def int_set(values: Collection[str] | None, flag: str) -> frozenset[int]:
    """`--rank 0,3 --rank 7` as {0, 3, 7}; UsageError naming the flag for a non-number."""
    out: set[int] = set()
    for v in values or ():
        for part in v.split(","):
            try:
                out.add(int(part))
            except ValueError:
                raise UsageError(f"{flag} {v!r}: not a number (or a comma-separated list)"
                                 ) from None
    return frozenset(out)


def str_set(values: Collection[str] | None) -> frozenset[str]:
    """`--node a,b --node c` as {a, b, c}."""
    return frozenset(p for v in values or () for p in v.split(",") if p)
