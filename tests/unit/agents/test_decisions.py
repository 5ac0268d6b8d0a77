"""What a decision means for a node (verdict) and the follower's dedupe by id."""

from __future__ import annotations

import asyncio
import time

from faultwatch import wire
from faultwatch.agents.decisions import (
    BLACKLISTED,
    FAIL,
    NOTIFY,
    RESTART,
    DecisionFollower,
    verdict,
)
from faultwatch.core.events import Decision


def dec(action: str, nodes: tuple[str, ...] = (), attempt: int = 0, did: str = "d1",
        **evidence: object) -> Decision:
    return Decision(id=did, job="j", attempt=attempt, action=action, kind="error", ts=time.time(),
                    nodes=nodes, evidence=dict(evidence))


def test_restart_sync_names_every_node_async_only_failed() -> None:
    assert verdict(dec("restart", ("a", "b")), "a", 0) == RESTART
    assert verdict(dec("restart", ("b",)), "a", 0) is None  # async: only the failed node
    assert verdict(dec("restart"), "a", 0) == RESTART  # no nodes: the whole job


def test_blacklist_fail_notify_and_other_attempts() -> None:
    assert verdict(dec("blacklist", ("a",)), "a", 0) == BLACKLISTED
    assert verdict(dec("blacklist", ("a",), restart_nodes=["a", "b"]), "b", 0) == RESTART
    assert verdict(dec("blacklist", ("a",)), "b", 0) is None
    assert verdict(dec("fail", ("a",)), "b", 0) == FAIL
    assert verdict(dec("notify"), "a", 0) == NOTIFY
    assert verdict(dec("restart", attempt=1), "a", 0) is None  # an older/newer attempt
    assert verdict(dec("bogus"), "a", 0) is None


def test_follower_dedupes_by_id_and_ignores_other_jobs() -> None:
    async def main() -> list[str]:
        f = DecisionFollower("x:1", "p.decisions", "j", lambda *a, **k: None)
        d = wire.decision_to_dict(dec("restart", did="same"))
        f.offer(d)
        f.offer(d)  # published twice after a processor crash
        f.offer({**d, "id": "other-job", "job": "k"})
        f.offer({"v": 1, "id": "broken"})  # undecodable: logged, skipped
        got = []
        while (x := f.get_nowait()) is not None:
            got.append(x.id)
        assert await f.get(0.01) is None
        return got

    assert asyncio.run(main()) == ["same"]
