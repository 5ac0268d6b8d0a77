"""The pure parts of following a topic (kafka/following.py): the backoff after broker errors
and the caught-up test; and that each follower's event names have a level (the eventlog scan
sees only literal names, and these live in class attributes)."""

from __future__ import annotations

from faultwatch import eventlog
from faultwatch.holds.follow import HoldsFollower
from faultwatch.kafka.following import RETRY_FIRST_S, RETRY_MAX_S, Backoff, read_to_end
from faultwatch.registry.follow import RegistryFollower
from faultwatch.streams.lemon_watch import IncidentsFollower


def test_the_backoff_doubles_up_to_its_cap_and_a_good_poll_resets_it() -> None:
    b = Backoff()
    waits = [b.failed() for _ in range(7)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert (RETRY_FIRST_S, RETRY_MAX_S) == (1.0, 30.0)  # the timing the followers had
    assert b.s == 30.0  # waiting on a missing topic uses the current wait, unchanged
    b.reset()
    assert b.failed() == 1.0 and b.failed() == 2.0


def test_caught_up_once_every_partition_reached_its_end_offset() -> None:
    end = {"p0": 3, "p1": 0, "p2": 5}
    assert not read_to_end({"p0": 3, "p1": 0, "p2": 4}, end)  # one partition is behind
    assert not read_to_end({"p0": 0, "p1": 0, "p2": 5}, end)
    assert read_to_end({"p0": 3, "p1": 0, "p2": 5}, end)
    assert read_to_end({"p0": 4, "p1": 1, "p2": 9}, end)  # new records meanwhile: still read
    assert read_to_end({}, {})  # no partition: nothing to read


def test_every_followers_events_have_a_level() -> None:
    names = [n for cls in (RegistryFollower, HoldsFollower, IncidentsFollower)
             for n in (cls.following_event, cls.failed_event) if n]
    assert names == ["registry_following", "registry_follow_failed", "holds_follow_failed",
                     "incidents_following", "incidents_follow_failed"]
    assert [n for n in names if n not in eventlog.LEVELS] == []
