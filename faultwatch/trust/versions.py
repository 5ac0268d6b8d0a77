"""Which of two signed state records of one subject is newer (a node's registry record, the
rule set): a version the signer writes, never a clock allowance.

Every record of a compacted state topic carries a sequence number its signer sets to one
more than the record it derived it from: a node record's `seq` (the processor's registry
writer and `faultwatch nodes quarantine|release` build on the node's record they read), a
rule set's `revision` (`rules push` and `rules rollback` number the push after the newest
one: rollout/rules_history.py); and its time (`updated_ts`, `pushed_at`). A follower holds
each subject's newest record and refuses one whose version (seq, time) is lower: an old
record written again (a quarantine replayed a second after its release) is `replayed`
whatever the clocks say.
Like TUF's metadata version and Kubernetes' resourceVersion, the version belongs to the
record's content, so the signature covers it. Records written before `seq` existed read as
seq 0 and are ordered by their time alone.

The limit: a compacted topic keeps the last record of a key. A replayed record written after
the newest one is refused by every follower that read the newest first, but once compaction
removed the newer record a follower starting from scratch has only the replay to read. The
ACLs (only processors and operators write these topics) are what keeps it off the topic.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Version = tuple[int, float]


def older(held: Version | None, new: Version) -> bool:
    """True when `new` is older than the held record's version (a replay: refuse it).
    An equal version is the same record read again (accepted, idempotent)."""
    return held is not None and new < held


def record_version(record: Mapping[str, Any], time_field: str, seq_field: str = "seq"
                   ) -> Version | None:
    """(seq, time) of a decoded record (a rule set's seq is its `revision`); None when its
    time is not a number."""
    seq, at = record.get(seq_field, 0), record.get(time_field)
    if type(seq) is not int or seq < 0 or not isinstance(at, int | float) \
            or isinstance(at, bool):
        return None
    return (seq, float(at))


def describe(v: Version) -> str:
    return f"seq {v[0]} of {v[1]:.0f}"
