"""Comparing every rank's Flight Recorder dump: who waits in which collective, who is missing.

Input: one decoded dump per global rank, as `torch._C._distributed_c10d._dump_fr_trace_json()`
returns it (or the unpickled `_dump_nccl_trace()` dict). Per process group we take, for each
rank, the last collective it *entered* (enqueued) and *completed*, from `pg_status` when
present, else from the entries. The rank(s) whose last entered collective is behind the
others' never joined the collective the others wait in; ranks that entered the same sequence
number with a different op, sizes or dtypes are a mismatch.

Quirks handled (seen with torch 2.13-2.15 on gloo): `pg_config` may name the default group
with an empty string while entries say `["0", "default_pg"]`; gloo entries stay `scheduled`
(progress shows only in `retired` and `pg_status`); `pg_status` numbers are strings; a rank
that finished its last collective may still report it as not completed (completion is
discovered lazily), so "entered" is what decides who is missing.

Pure: plain dicts in, plain data out; no torch import, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_MISMATCHES = 8


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective call as a rank recorded it."""

    seq: int
    op: str
    sizes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()
    frames: tuple[str, ...] = ()  # "file:line in name", innermost last (when recorded)

    def describe(self) -> str:
        shapes = ", ".join("\u00d7".join(str(n) for n in s) or "scalar" for s in self.sizes)
        types = ",".join(sorted({d.lower() for d in self.dtypes}))
        inner = " ".join(x for x in (shapes, types) if x)
        return f"{self.op} #{self.seq}" + (f" ({inner})" if inner else "")

    def signature(self) -> tuple[str, tuple[tuple[int, ...], ...], tuple[str, ...]]:
        return self.op, self.sizes, self.dtypes


@dataclass(frozen=True, slots=True)
class RankView:
    """One rank's position in one process group."""

    rank: int
    entered: int  # last collective sequence number the rank enqueued (-1: none)
    completed: int  # last one it saw complete (-1: none)
    last: Collective | None  # the entry for `entered`, if the ring buffer still holds it


@dataclass(frozen=True)
class GroupFinding:
    """What the dumps say about one process group."""

    group: str
    ranks: tuple[int, ...]
    views: dict[int, RankView]
    front: int  # the highest sequence number any rank entered
    waiting: tuple[int, ...]  # ranks inside collective `front`, not completed
    missing: tuple[int, ...]  # ranks that never entered collective `front`
    mismatches: tuple[dict[str, Any], ...] = ()

    @property
    def stuck(self) -> bool:
        return bool(self.missing or self.mismatches)


@dataclass(frozen=True)
class Analysis:
    """The comparison of all ranks' dumps, and a sentence a person can act on."""

    groups: tuple[GroupFinding, ...]
    culprits: tuple[int, ...]
    summary: str
    ranks_dumped: tuple[int, ...] = ()
    problems: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary, "culprit_ranks": list(self.culprits),
            "ranks_dumped": list(self.ranks_dumped), "problems": list(self.problems),
            "groups": [{
                "group": g.group, "ranks": list(g.ranks), "front": g.front,
                "waiting": list(g.waiting), "missing": list(g.missing),
                "mismatches": list(g.mismatches),
                "last": {str(r): {"entered": v.entered, "completed": v.completed,
                                  "op": v.last.describe() if v.last else None}
                         for r, v in sorted(g.views.items())},
            } for g in self.groups],
        }


def _int(x: Any, default: int = -1) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        return default


def _op_name(entry: Mapping[str, Any]) -> str:
    name = str(entry.get("profiling_name") or "?")
    return name.split(":", 1)[1] if ":" in name else name  # "gloo:all_reduce", "nccl:..."


def _frames(entry: Mapping[str, Any]) -> tuple[str, ...]:
    out = []
    for f in entry.get("frames") or ():
        if isinstance(f, Mapping):
            out.append(f"{f.get('filename', '?')}:{f.get('line', '?')} in {f.get('name', '?')}")
    return tuple(reversed(out[:16]))


def _collective(entry: Mapping[str, Any]) -> Collective:
    sizes = tuple(tuple(_int(n, 0) for n in s) for s in entry.get("input_sizes") or ()
                  if isinstance(s, list | tuple))
    dtypes = tuple(str(d) for d in entry.get("input_dtypes") or ())
    return Collective(_int(entry.get("collective_seq_id")), _op_name(entry), sizes, dtypes,
                      _frames(entry))


def _group_key(entry: Mapping[str, Any]) -> str:
    pg = entry.get("process_group")
    if isinstance(pg, list | tuple) and pg:
        desc = str(pg[1]) if len(pg) > 1 and pg[1] else ""
        return desc or str(pg[0])
    return str(entry.get("pg_id", "0"))


def _group_ids(dump: Mapping[str, Any]) -> dict[str, str]:
    """pg_id (as in pg_status) -> group key, from the entries (pg_config may be unnamed)."""
    out: dict[str, str] = {}
    for e in dump.get("entries") or ():
        if isinstance(e, Mapping) and not e.get("is_p2p"):
            out.setdefault(str(e.get("pg_id", "0")), _group_key(e))
    return out


def _members(dumps: Mapping[int, Mapping[str, Any]], key: str) -> tuple[int, ...]:
    """Global ranks of a group: from pg_config when it names the group, else every dumper."""
    for d in dumps.values():
        for name, cfg in (d.get("pg_config") or {}).items():
            if not isinstance(cfg, Mapping):
                continue
            names = {name, cfg.get("desc"), cfg.get("name")}
            if key == "default_pg" and names <= {"", None, "0"}:
                names.add(key)  # gloo leaves the default group unnamed in pg_config
            if key in names and cfg.get("ranks"):
                raw = str(cfg["ranks"]).strip("[] ")
                ranks = [_int(x) for x in raw.split(",") if x.strip()]
                if ranks and all(r >= 0 for r in ranks):
                    return tuple(sorted(ranks))
    return tuple(sorted(dumps))


TRIM_ENTRIES = 16  # collectives kept per process group in a shipped dump
TRIM_FRAMES = 4
MAX_GROUPS = 64  # process-group configs kept in a shipped dump
_ENTRY_KEYS = ("collective_seq_id", "profiling_name", "input_sizes", "input_dtypes",
               "process_group", "pg_id", "is_p2p", "state")


def trim(dump: Mapping[str, Any], keep: int = TRIM_ENTRIES) -> dict[str, Any]:
    """The part of a rank's dump that analyse() reads: pg_config, pg_status and the last
    `keep` collectives of each process group with a few frames (kilobytes, not megabytes)."""
    per_group: dict[str, list[Mapping[str, Any]]] = {}
    for e in dump.get("entries") or ():
        if isinstance(e, Mapping) and not e.get("is_p2p"):
            per_group.setdefault(_group_key(e), []).append(e)
    entries = []
    for es in per_group.values():
        for e in es[-keep:]:
            x = {k: e[k] for k in _ENTRY_KEYS if k in e}
            frames = [f for f in e.get("frames") or () if isinstance(f, Mapping)]
            x["frames"] = [{k: f.get(k) for k in ("name", "filename", "line")}
                           for f in frames[:TRIM_FRAMES]]
            entries.append(x)
    pg_config = dump.get("pg_config") or {}
    if isinstance(pg_config, Mapping) and len(pg_config) > MAX_GROUPS:
        pg_config = dict(list(pg_config.items())[:MAX_GROUPS])
    return {"version": dump.get("version"), "pg_config": pg_config,
            "pg_status": dump.get("pg_status") or {}, "entries": entries}


def analyse(dumps: Mapping[int, Mapping[str, Any]]) -> Analysis:
    """Compare the dumps of every rank that answered (global rank -> decoded dump)."""
    problems: list[str] = []
    per_rank: dict[int, dict[str, list[Collective]]] = {}
    status: dict[int, dict[str, tuple[int, int]]] = {}
    keys: set[str] = set()
    for rank, d in dumps.items():
        entries: dict[str, list[Collective]] = {}
        for e in d.get("entries") or ():
            if not isinstance(e, Mapping) or e.get("is_p2p"):
                continue
            c = _collective(e)
            if c.seq < 0:
                continue
            entries.setdefault(_group_key(e), []).append(c)
        per_rank[rank] = entries
        keys.update(entries)
        ids = _group_ids(d)
        st: dict[str, tuple[int, int]] = {}
        for pg_id, s in (d.get("pg_status") or {}).items():
            if isinstance(s, Mapping):
                key = ids.get(str(pg_id), "default_pg" if str(pg_id) == "0" else str(pg_id))
                st[key] = (_int(s.get("last_enqueued_collective")),
                           _int(s.get("last_completed_collective")))
                keys.add(key)
        status[rank] = st
    groups: list[GroupFinding] = []
    for key in sorted(keys):
        members = _members(dumps, key)
        views: dict[int, RankView] = {}
        for r in members:
            if r not in dumps:
                continue
            colls = sorted(per_rank.get(r, {}).get(key, ()), key=lambda c: c.seq)
            entered, completed = status.get(r, {}).get(key, (-1, -1))
            if colls:
                entered = max(entered, colls[-1].seq)
            by_seq = {c.seq: c for c in colls}
            views[r] = RankView(r, entered, completed, by_seq.get(entered))
        if not views:
            continue
        absent = [r for r in members if r not in dumps]
        if absent:
            problems.append(f"group {key}: no dump from rank(s) {absent}")
        front = max(v.entered for v in views.values())
        waiting = tuple(sorted(r for r, v in views.items()
                               if v.entered == front and v.completed < front))
        missing = tuple(sorted(r for r, v in views.items() if v.entered < front))
        groups.append(GroupFinding(key, members, views, front, waiting, missing,
                                   _mismatches(per_rank, key, views)))
    culprits = sorted({r for g in groups for r in g.missing}
                      | {r for g in groups for m in g.mismatches for r in m["odd_ranks"]})
    return Analysis(tuple(groups), tuple(culprits), _summary(groups), tuple(sorted(dumps)),
                    tuple(problems))


def _mismatches(per_rank: Mapping[int, Mapping[str, list[Collective]]], key: str,
                views: Mapping[int, RankView]) -> tuple[dict[str, Any], ...]:
    """Sequence numbers that ranks entered with different ops, sizes or dtypes."""
    by_seq: dict[int, dict[int, Collective]] = {}
    for r in views:
        for c in per_rank.get(r, {}).get(key, ()):
            by_seq.setdefault(c.seq, {})[r] = c
    out: list[dict[str, Any]] = []
    for seq in sorted(by_seq):
        calls = by_seq[seq]
        sigs: dict[tuple[Any, ...], list[int]] = {}
        for r, c in calls.items():
            sigs.setdefault(c.signature(), []).append(r)
        if len(sigs) < 2:
            continue
        common = max(sigs.values(), key=len)
        if 2 * len(common) <= len(calls):  # no majority: every rank is a suspect
            odd = sorted(calls)
        else:
            odd = sorted(r for rs in sigs.values() if rs is not common for r in rs)
        out.append({"seq": seq, "odd_ranks": odd,
                    "calls": {str(r): calls[r].describe() for r in sorted(calls)}})
        if len(out) >= MAX_MISMATCHES:
            break
    return tuple(out)


def _ranks(rs: tuple[int, ...] | list[int]) -> str:
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(str(r) for r in rs)


def _summary(groups: list[GroupFinding]) -> str:
    parts: list[str] = []
    for g in groups:
        if g.mismatches:
            m = g.mismatches[0]
            calls = "; ".join(f"rank {r}: {d}" for r, d in m["calls"].items())
            parts.append(f"collective #{m['seq']} differs across ranks ({calls})")
        if g.missing:
            ref = next((g.views[r].last for r in g.waiting or sorted(g.views)
                        if g.views[r].entered == g.front and g.views[r].last), None)
            what = ref.describe() if ref else f"collective #{g.front}"
            behind = ", ".join(f"rank {r} last entered #{g.views[r].entered}"
                               for r in g.missing[:8])
            waiters = g.waiting or tuple(r for r, v in g.views.items() if v.entered == g.front)
            where = "" if g.group in ("default_pg", "", "0") else f" of group {g.group}"
            parts.append(f"{_ranks(waiters)} wait{'s' if len(waiters) == 1 else ''} in "
                         f"{what}{where}; {_ranks(g.missing)} never entered it ({behind})")
    return "; ".join(parts) or "every rank entered the same collectives (no rank missing)"
