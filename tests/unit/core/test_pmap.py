"""PMap.update is `set` of every item at once: the same map, order and length, the original
left as it was, across the flat-to-sharded size."""

from __future__ import annotations

import random

from faultwatch.core.pmap import PMap


def test_update_equals_one_set_per_item_and_leaves_the_original_alone() -> None:
    rng = random.Random(14)
    for _ in range(400):
        start = {rng.randrange(200): rng.random() for _ in range(rng.choice((0, 5, 31, 32, 80)))}
        m = PMap(start)
        items = {rng.randrange(-1, 200): rng.random() for _ in range(rng.randrange(0, 40))}
        one_by_one = m
        for k, v in items.items():
            one_by_one = one_by_one.set(k, v)
        got = m.update(items)
        assert list(got.items()) == list(one_by_one.items())  # same content, same order
        assert len(got) == len(one_by_one) == len(start | items)
        assert m.to_dict() == start and len(m) == len(start)  # persistent
        assert all(got.get(k) == v for k, v in items.items())
    assert PMap({1: 2.0}).update({}).to_dict() == {1: 2.0}


def test_the_shared_empty_map_is_never_changed_and_decoded_states_share_it() -> None:
    import orjson

    from faultwatch.core.events import RunStart
    from faultwatch.core.job import new_state
    from faultwatch.core.pmap import EMPTY, empty
    from faultwatch.core.state import JobState

    grown = empty().set("a", 1).update({"b": 2})
    assert dict(grown.items()) == {"a": 1, "b": 2} and len(EMPTY) == 0 and not list(EMPTY)
    st = new_state(RunStart("j", 0, "n0", 1.0, run_id="r"))
    assert st is not None
    back = JobState.from_dict(orjson.loads(orjson.dumps(st.to_dict())))
    assert back == st
    assert back.same_error is EMPTY and back.hists is EMPTY  # not one new map per field
    assert back.nodes is not EMPTY or not st.nodes
