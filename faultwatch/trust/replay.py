"""The replay rule (docs/decisions.md): a decision acts once, only on the run it names, and
only within a maximum age. Every consumer (agent follower, actuate, notify) asks a
ReplayGuard before acting; the ids it let act are kept (in a file where the consumer has one)
for the whole age window, however many there are: an id is forgotten only once both its
decision's time and the time it was let act are older than the window (plus the clock
allowance), so a copy of it, even one stamped later, is refused as `replayed` while it could
still be young enough to act; a restarted consumer still refuses an exact replay. What is
kept is bounded by the decisions of one window, not by a count.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import orjson

from faultwatch import settings
from faultwatch.errors import ConfigError
from faultwatch.trust.refusals import REFUSALS

MAX_AGE_ENV = settings.MAX_DECISION_AGE_S.name
DEFAULT_MAX_AGE_S: float = settings.MAX_DECISION_AGE_S.fallback
MAX_FUTURE_S = 60.0  # a decision stamped further ahead than this (clock skew) is refused
TOO_OLD, FROM_FUTURE, REPLAYED, OTHER_RUN, NO_RUN, BEFORE_START = (
    "too_old", "from_future", "replayed", "other_run", "no_run", "before_start")
PRUNE_EVERY_S = 60.0  # ids past the window are dropped at most this often


def max_age_s(flag: float | None = None, env: Mapping[str, str] | None = None) -> float:
    """--max-decision-age-s, else $FAULTWATCH_MAX_DECISION_AGE_S, else 600 s."""
    e = os.environ if env is None else env
    if flag is not None:
        value: Any = flag
        where = "--max-decision-age-s"
    elif e.get(MAX_AGE_ENV):
        value, where = e[MAX_AGE_ENV], MAX_AGE_ENV
    else:
        return DEFAULT_MAX_AGE_S
    try:
        v = float(value)
    except ValueError:
        raise ConfigError(where, f"{value!r} is not a number of seconds") from None
    if not 1.0 <= v <= 7 * 86400.0:
        raise ConfigError(where, f"{v:g} s is outside 1 s .. 7 days")
    return v


def run_matches(ours: Collection[str], named: str, named_all: Collection[str]) -> str | None:
    """None when a decision naming run `named` (and the joined runs `named_all`) is about
    one of `ours`; else the refusal reason."""
    if not named:
        return NO_RUN
    if named in ours or any(r in ours for r in named_all):
        return None
    return OTHER_RUN


class ReplayGuard:
    """check(id, ts, now) -> None (may act: remembered) or the refusal reason (counted)."""

    def __init__(self, what: str, max_age_s: float = DEFAULT_MAX_AGE_S,
                 state_file: Path | None = None, log: Callable[..., None] | None = None
                 ) -> None:
        self.what, self.max_age_s, self.state_file = what, max_age_s, state_file
        self._log = log
        # id -> (the later of its ts and when it was let act, where it was read)
        self.seen: dict[str, tuple[float, str]] = {}
        self.refused = 0
        self._lines = 0
        self._pruned = float("-inf")
        if state_file is not None:
            self._load(state_file)

    def _load(self, path: Path) -> None:
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as e:
            raise ConfigError(str(path), f"cannot read the replay state: {e.strerror or e}"
                              ) from None
        for line in text.splitlines():
            with contextlib.suppress(orjson.JSONDecodeError, TypeError, ValueError):
                did, ts, where = orjson.loads(line)
                if isinstance(did, str) and isinstance(ts, int | float):
                    self.seen[did] = (float(ts), str(where))
                    self._lines += 1

    def check(self, did: str, ts: float, now: float, where: str = "") -> str | None:
        """`where` (topic[partition]@offset) tells a re-read of the same record (a consumer
        group resuming from its last commit: allowed, the consumer dedupes its own work)
        from a copy of it written again (a replay: refused)."""
        if ts < now - self.max_age_s:
            return self._refuse(TOO_OLD)
        if ts > now + MAX_FUTURE_S:
            return self._refuse(FROM_FUTURE)
        if did in self.seen:
            if where and self.seen[did][1] == where:
                return None
            return self._refuse(REPLAYED)
        self.remember(did, ts, now, where)
        return None

    def prune(self, now: float) -> int:
        """Forget the ids no copy of which could be young enough to act (refused by age
        anyway); returns how many."""
        self._pruned = now
        horizon = now - self.max_age_s - MAX_FUTURE_S
        old = [d for d, (t, _) in self.seen.items() if t < horizon]
        for d in old:
            del self.seen[d]
        return len(old)

    def refuse_run(self, reason: str) -> str:
        return self._refuse(reason)

    def _refuse(self, reason: str) -> str:
        self.refused += 1
        REFUSALS[(self.what, reason)] += 1
        return reason

    def remember(self, did: str, ts: float, now: float, where: str = "") -> None:
        ts = max(ts, now)  # kept a window past the later of its time and now
        self.seen[did] = (ts, where)
        if now - self._pruned >= PRUNE_EVERY_S:
            self.prune(now)
        if self.state_file is None:
            return
        try:
            if self._lines > 2 * max(len(self.seen), 512):
                tmp = self.state_file.with_name(self.state_file.name + ".tmp")
                tmp.write_bytes(b"".join(orjson.dumps([d, t, w]) + b"\n"
                                         for d, (t, w) in self.seen.items()))
                os.replace(tmp, self.state_file)
                self._lines = len(self.seen)
            else:
                with self.state_file.open("ab") as f:
                    f.write(orjson.dumps([did, ts, where]) + b"\n")
                    f.flush()
                    os.fsync(f.fileno())
                self._lines += 1
        except OSError as e:
            if self._log is not None:
                self._log("replay_state_unwritable", path=str(self.state_file),
                          error=e.strerror or str(e))
