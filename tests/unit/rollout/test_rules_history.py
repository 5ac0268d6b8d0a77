"""Rule-set revisions (issue 36 item 5, `rules history|rollback`): the kept revisions and the
set in force read back from the rules topic's records, and which revision a rollback pushes
again (kubectl's `rollout undo` semantics: the one before, or the one named)."""

from __future__ import annotations

import orjson
import pytest

from faultwatch.errors import NotFoundError, UsageError
from faultwatch.rollout.rules_history import (
    MAX_REVISIONS,
    NOTHING,
    history,
    next_revision,
    revision_key,
    rollback_target,
)
from faultwatch.rollout.rules_record import RULESET_KEY, layer_of_record, record_of_texts

SITE = "version: 1\nrules:\n  - id: site.{n}\n    category: retryable\n    contains: 'boom {n}'\n"


def push(records: list[tuple[bytes, bytes]], n: int, **extra: object) -> bytes:
    value, _ = record_of_texts([(f"site{n}.yaml", SITE.format(n=n))], revision=n, **extra)
    records += [(revision_key(n), value), (RULESET_KEY, value)]
    return value


def test_revisions_are_read_back_and_the_topic_keeps_the_last_ten() -> None:
    records: list[tuple[bytes, bytes]] = []
    for n in range(1, 13):
        push(records, n)
    revs, current = history(records)
    assert [r.revision for r in revs] == list(range(13 - MAX_REVISIONS, 13))
    assert current is not None and current.revision == 12
    assert revs[-1].files == [("site12.yaml", SITE.format(n=12))]
    assert next_revision(revs, current) == 13
    s = revs[-1].summary()
    assert (s["revision"], s["files"], s["rollback_of"], s["signed_by"]) == (
        12, ["site12.yaml"], None, None)
    assert "unsigned" in revs[-1].line()
    layer, _, _ = layer_of_record(records[-1][1])  # the processors' view names the revision
    assert layer.meta["revision"] == 12


def test_a_rollback_goes_to_the_revision_before_or_the_one_named() -> None:
    records: list[tuple[bytes, bytes]] = []
    for n in (1, 2, 3):
        push(records, n)
    revs, current = history(records)
    assert rollback_target(revs, current, None).revision == 2
    assert rollback_target(revs, current, 1).revision == 1
    assert rollback_target(revs, current, 0) is NOTHING
    with pytest.raises(UsageError, match="in force already"):
        rollback_target(revs, current, 3)
    with pytest.raises(NotFoundError, match="revision 7 is not kept"):
        rollback_target(revs, current, 7)
    # the rollback is revision 4 (revision 2's files); undoing it goes to 3, as kubectl does
    value, _ = record_of_texts(revs[1].files, revision=4, rollback_of=3, from_revision=2)
    records += [(revision_key(4), value), (RULESET_KEY, value)]
    revs, current = history(records)
    assert current is not None and current.revision == 4
    assert orjson.loads(value)["files"] == orjson.loads(records[2][1])["files"]
    assert "(rollback of 3 to 2)" in revs[-1].line()
    assert rollback_target(revs, current, None).revision == 3


def test_the_first_push_rolls_back_to_nothing_and_nothing_to_nowhere() -> None:
    records: list[tuple[bytes, bytes]] = []
    push(records, 1)
    assert rollback_target(*history(records), None) is NOTHING
    with pytest.raises(NotFoundError, match="nothing was pushed"):
        rollback_target(*history([]), None)
    unnumbered, _ = record_of_texts([("old.yaml", SITE.format(n=9))])
    revs, current = history([(RULESET_KEY, unnumbered)])
    assert revs == [] and current is not None and current.revision == -1
    with pytest.raises(NotFoundError, match="--to-revision"):
        rollback_target(revs, current, None)
