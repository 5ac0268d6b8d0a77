"""A small persistent map: updating one key copies one shard, not the whole map.

A job's per-rank and per-node maps can hold 10k entries; the state machine is pure (every
transition returns a new value), so a plain dict would be copied on every event. PMap
splits its keys over SHARDS dicts by hash; `set` copies one shard and the shard tuple.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import chain
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

SHARDS = 64
_SMALL = 32  # up to this many keys one flat shard is cheaper than 64


class PMap(Generic[K, V]):
    """An immutable mapping with cheap single-key updates (compare with ==, iterate items)."""

    __slots__ = ("_shards", "_len")

    def __init__(self, items: dict[K, V] | None = None) -> None:
        items = items or {}
        if len(items) <= _SMALL:
            self._shards: tuple[dict[K, V], ...] = (dict(items),)
        else:
            shards: list[dict[K, V]] = [{} for _ in range(SHARDS)]
            for k, v in items.items():
                shards[hash(k) % SHARDS][k] = v
            self._shards = tuple(shards)
        self._len = len(items)

    def _shard(self, key: K) -> int:
        return 0 if len(self._shards) == 1 else hash(key) % SHARDS

    def getter(self) -> Callable[[K], Any]:
        """`get` as one callable: a small map's own dict.get (no Python frame per call in
        a fold's per-rank loop), a sharded map's method."""
        return self._shards[0].get if len(self._shards) == 1 else self.get

    def get(self, key: K, default: Any = None) -> Any:
        return self._shards[self._shard(key)].get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._shards[self._shard(key)]  # type: ignore[arg-type]

    def __getitem__(self, key: K) -> V:
        return self._shards[self._shard(key)][key]

    def __len__(self) -> int:
        return self._len

    # (iteration: a small map's one dict directly, a sharded one's dicts chained, both in C)
    def __iter__(self) -> Iterator[K]:
        if len(self._shards) == 1:
            return iter(self._shards[0])
        return chain.from_iterable(self._shards)

    def items(self) -> Iterator[tuple[K, V]]:
        if len(self._shards) == 1:
            return iter(self._shards[0].items())
        return chain.from_iterable(map(dict.items, self._shards))

    def values(self) -> Iterator[V]:
        if len(self._shards) == 1:
            return iter(self._shards[0].values())
        return chain.from_iterable(map(dict.values, self._shards))

    def set(self, key: K, value: V) -> PMap[K, V]:
        i = self._shard(key)
        old = self._shards[i]
        grew = key not in old
        if grew and len(self._shards) == 1 and self._len >= _SMALL:
            d = dict(old)
            d[key] = value
            return PMap(d)
        shard = dict(old)
        shard[key] = value
        new: PMap[K, V] = PMap.__new__(PMap)
        new._shards = self._shards[:i] + (shard,) + self._shards[i + 1:]
        new._len = self._len + (1 if grew else 0)
        return new

    def update(self, items: dict[K, V]) -> PMap[K, V]:
        """`set` of every item at once: each touched shard is copied once (a node's output
        updates 8 or more ranks of one job)."""
        if not items:
            return self
        new: PMap[K, V] = PMap.__new__(PMap)
        if len(self._shards) == 1:
            d = dict(self._shards[0])
            d.update(items)
            if len(d) > _SMALL and len(d) > self._len:
                return PMap(d)  # grew past the flat size: sharded, as `set` does
            new._shards, new._len = (d,), len(d)
            return new
        shards = list(self._shards)
        copied: set[int] = set()
        grew = 0
        for k, v in items.items():
            i = hash(k) % SHARDS
            if i not in copied:
                shards[i] = dict(shards[i])
                copied.add(i)
            shard = shards[i]
            if k not in shard:
                grew += 1
            shard[k] = v
        new._shards, new._len = tuple(shards), self._len + grew
        return new

    def remove(self, key: K) -> PMap[K, V]:
        i = self._shard(key)
        if key not in self._shards[i]:
            return self
        shard = dict(self._shards[i])
        del shard[key]
        new: PMap[K, V] = PMap.__new__(PMap)
        new._shards = self._shards[:i] + (shard,) + self._shards[i + 1:]
        new._len = self._len - 1
        return new

    def to_dict(self) -> dict[K, V]:
        out: dict[K, V] = {}
        for s in self._shards:
            out.update(s)
        return out

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PMap):
            return self._len == other._len and self.to_dict() == other.to_dict()
        if isinstance(other, dict):
            return self.to_dict() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PMap({self.to_dict()!r})"


EMPTY: PMap[Any, Any] = PMap()  # immutable, so one empty map serves every empty field


def empty() -> PMap[Any, Any]:
    """The shared empty map (a dataclass default_factory): a job state holds ~13 maps, most
    of them empty, and ~200 bytes each made a decoded one-record job 4 kB."""
    return EMPTY
