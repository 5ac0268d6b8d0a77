"""Rule-set revisions, for `rules history` and `rules rollback` (like `kubectl rollout history`
and `rollout undo`). Every push is numbered (`revision` in its record) and also written under
the key `revision/<n mod MAX_REVISIONS>` of the compacted rules topic, so the last
MAX_REVISIONS pushes survive compaction while the topic stays bounded. A rollback pushes an
earlier revision's files again as a new revision, signed by the operator who rolls back
(never the old record itself: its signature and time would be refused as a replay).
Revision 0 is "nothing pushed": each worker's built-in and `--rules` layers alone.
Processors apply only the `ruleset` key (rollout/rules_watch.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from faultwatch.errors import NotFoundError, UsageError
from faultwatch.wire.rules import (  # noqa: F401 - re-exported
    MAX_REVISIONS,
    REVISION_PREFIX,
    RULESET_KEY,
    revision_key,
)


@dataclass(frozen=True)
class Revision:
    """One numbered push as the topic keeps it (0: nothing pushed)."""

    revision: int
    record: Mapping[str, Any]

    @property
    def files(self) -> list[tuple[str, str]]:
        return [(f["name"], f["text"]) for f in self.record.get("files") or ()
                if isinstance(f, dict) and isinstance(f.get("name"), str)
                and isinstance(f.get("text"), str)]

    @property
    def builtin(self) -> bool:
        return self.record.get("builtin", True) is not False

    def summary(self) -> dict[str, Any]:
        """What `rules history` shows of it."""
        r = self.record
        return {"revision": self.revision, "version": r.get("version"),
                "push_id": r.get("push_id"), "author": r.get("author"),
                "pushed_at": r.get("pushed_at"), "files": [n for n, _ in self.files],
                "builtin": self.builtin, "rollback_of": r.get("rollback_of"),
                "from_revision": r.get("from_revision"),
                "signed_by": (r.get("signature") or {}).get("key_id")
                if isinstance(r.get("signature"), dict) else None}

    def line(self) -> str:
        """`3  version abc  push 5f3e by alice@h at 2026-...  site.yaml (rollback of 5)`."""
        return f"{self.revision}  {self.describe()}"

    def describe(self) -> str:
        """What the revision holds, without its number."""
        import time

        s = self.summary()
        if self.revision == 0:
            return "nothing pushed (built-in and each worker's --rules files)"
        at = s["pushed_at"]
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)) \
            if isinstance(at, int | float) else "-"
        out = (f"version {s['version']}  push {s['push_id']} by "
               f"{s['author']} at {when}  {', '.join(s['files']) or '(no files)'}")
        if s["rollback_of"] is not None:
            out += f"  (rollback of {s['rollback_of']} to {s['from_revision']})"
        return out + ("" if s["signed_by"] else "  unsigned")


NOTHING = Revision(0, {"files": [], "builtin": True})


def _decoded(value: bytes | None) -> dict[str, Any] | None:
    if value is None:
        return None
    try:
        d = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    return d if isinstance(d, dict) and isinstance(d.get("files"), list) else None


def history(records: Iterable[tuple[bytes | None, bytes | None]]
            ) -> tuple[list[Revision], Revision | None]:
    """(the kept revisions, oldest first; the set in force: the `ruleset` record, None when
    nothing was pushed) of rules-topic records in offset order (the last per key wins)."""
    latest: dict[bytes, bytes | None] = {}
    for key, value in records:
        if key is not None:
            latest[key] = value
    revs: dict[int, Revision] = {}
    for key, value in latest.items():
        d = _decoded(value) if key.startswith(REVISION_PREFIX) else None
        n = d.get("revision") if d else None
        if d is not None and isinstance(n, int) and n > 0:
            revs[n] = Revision(n, d)
    cur = _decoded(latest.get(RULESET_KEY))
    current = None
    if cur is not None:
        n = cur.get("revision")
        current = Revision(n if isinstance(n, int) and n > 0 else -1, cur)  # -1: unnumbered
    return [revs[n] for n in sorted(revs)], current


def next_revision(revs: list[Revision], current: Revision | None) -> int:
    return max([r.revision for r in revs] + [current.revision if current else 0, 0]) + 1


def rollback_target(revs: list[Revision], current: Revision | None,
                    to: int | None) -> Revision:
    """The revision a rollback pushes again: `to`, or the one before the set in force (0,
    nothing pushed, before the first). NotFoundError when there is none to go back to."""
    if current is None:
        raise NotFoundError("nothing was pushed: there is no rule set to roll back")
    if to is not None:
        if to == 0:
            return NOTHING
        found = next((r for r in revs if r.revision == to), None)
        if found is None:
            kept = ", ".join(str(r.revision) for r in revs) or "none"
            raise NotFoundError(f"revision {to} is not kept on the rules topic (kept: "
                                f"{kept}, and 0 for nothing pushed)")
        if found.revision == current.revision:
            raise UsageError(f"revision {to} is the set in force already")
        return found
    if current.revision < 0:
        raise NotFoundError("the set in force was pushed without a revision number (an "
                            "older faultwatch): say which revision with --to-revision "
                            "(0: nothing pushed)")
    earlier = [r for r in revs if r.revision < current.revision]
    if earlier:
        return earlier[-1]
    if current.revision == 1:
        return NOTHING
    raise NotFoundError(f"no revision before {current.revision} is kept (the topic keeps "
                        f"the last {MAX_REVISIONS}); --to-revision 0 removes the pushed set")
