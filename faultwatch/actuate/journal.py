"""The actuator's state file: an append-only journal of actions begun and done, for dedupe and
safe replay after a crash (an action begun but not done is run again; every backend action is
idempotent or checks the scheduler's state first)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import orjson

from faultwatch.actuate.plan import Action
from faultwatch.eventlog import log_event

MAX_KEYS = 100_000  # compaction keeps the newest done keys


class Journal:
    """`begin(action)` before acting, `done(action, result)` after; `is_done(key)` dedupes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done_keys: dict[str, float] = {}
        self.pending: dict[str, Action] = {}  # begun, not done: replay these
        self._load()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "ab")  # noqa: SIM115 - lives as long as the journal

    def _load(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                try:
                    d = orjson.loads(raw)
                    key, phase = d["key"], d["phase"]
                    if phase == "begin":
                        self.pending[key] = Action.from_dict(d["action"])
                    elif phase == "done":
                        self.done_keys[key] = float(d.get("ts", 0.0))
                        self.pending.pop(key, None)
                    elif phase == "dropped":  # overtaken by the registry: not done, not due
                        self.pending.pop(key, None)
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                    # a torn last line after a crash: the action is replayed, nothing lost
                    log_event("actuate_journal_bad_line", path=str(self.path), line=lineno,
                              error=repr(e)[:200])

    def is_done(self, key: str) -> bool:
        return key in self.done_keys

    def _append(self, d: dict[str, object]) -> None:
        self._fh.write(orjson.dumps(d) + b"\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def begin(self, action: Action) -> None:
        self.pending[action.key] = action
        self._append({"key": action.key, "phase": "begin", "ts": time.time(),
                      "action": action.to_dict()})

    def done(self, action: Action, result: str) -> None:
        self.pending.pop(action.key, None)
        now = time.time()
        self.done_keys[action.key] = now
        self._append({"key": action.key, "phase": "done", "ts": now, "result": result})
        if len(self.done_keys) > MAX_KEYS:
            self._compact()

    def drop(self, action: Action, why: str) -> None:
        """A begun action the registry overtook (recheck.py): no longer pending, not done
        either (the same intent, asked for again by a newer record, may still run)."""
        if self.pending.pop(action.key, None) is not None:
            self._append({"key": action.key, "phase": "dropped", "ts": time.time(),
                          "why": why[:300]})

    def _compact(self) -> None:
        keep = sorted(self.done_keys.items(), key=lambda kv: kv[1])[-MAX_KEYS // 2:]
        self.done_keys = dict(keep)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            for k, ts in keep:
                fh.write(orjson.dumps({"key": k, "phase": "done", "ts": ts}) + b"\n")
            for a in self.pending.values():
                fh.write(orjson.dumps({"key": a.key, "phase": "begin", "ts": time.time(),
                                       "action": a.to_dict()}) + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        self._fh.close()
        os.replace(tmp, self.path)
        self._fh = open(self.path, "ab")  # noqa: SIM115

    def close(self) -> None:
        self._fh.close()
