"""Line-prefix normaliser: strips what launchers, loggers and log shippers put before the text."""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from dataclasses import dataclass
from itertools import accumulate, compress, repeat
from operator import add

# Each kind: (name, pattern). Patterns use only syntax that Python's `re`, the `regex` module
# and hyperscan all accept once the named groups are made non-capturing (`hs_source`); a
# named group `rank` or `node` says what the prefix tells about where the line came from.
# Every pattern ends after the prefix and the single space (if any) that follows it.
_TS = r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?"
PREFIX_KINDS: tuple[tuple[str, str], ...] = (
    # our agent's and many wrappers' stream tags, often glued to the text: [stderr]Traceback
    ("stream", r"\[(?:stdout|stderr|STDOUT|STDERR)\] ?"),
    # [2025-04-09 17:15:22] / [2025-04-09T17:15:22.123Z] (loggers, wrappers)
    ("timestamp", r"\[" + _TS + r"\] ?"),
    # kubectl logs --timestamps, docker logs -t, journalctl -o short-iso: RFC 3339 then a space
    ("rfc3339", _TS + r":? "),
    # syslog / journalctl short format: "Apr  9 17:15:22 host kernel: " or "host sshd[12]: "
    ("syslog", r"[A-Z][a-z]{2} [ 0-9]\d \d\d:\d\d:\d\d (?P<node>[A-Za-z0-9][\w.-]{0,62}) "
               r"[\w./@-]{1,32}(?:\[\d{1,10}\])?: "),
    # dmesg: "[12345.678901] " (seconds since boot)
    ("dmesg", r"\[ {0,12}\d{1,12}\.\d{6}\] ?"),
    # a kernel line forwarded without the syslog head
    ("kernel", r"kernel: "),
    # torchrun --tee / log_line_prefix_template and torch's own: [rank3]: [default0]:
    ("rank", r"\[[A-Za-z_]{1,32}?(?P<rank>\d{1,7})\]: ?"),
    # DeepSpeed / Megatron print helpers: "[Rank 0] "
    ("rank_word", r"\[Rank (?P<rank>\d{1,7})\] "),
    # Open MPI mpirun --tag-output (Horovod): "[1,3]<stdout>:" (job, rank)
    ("mpi_tag", r"\[\d{1,6},(?P<rank>\d{1,7})\]<(?:stdout|stderr)>: ?"),
    # srun -l / --label: the task id, padded with spaces to the widest one: " 3: "
    ("srun_label", r" {0,6}(?P<rank>\d{1,6}): "),
    # Ray workers and daemons: "(RayTrainWorker pid=123, ip=10.0.0.5) ", "(pid=123) "
    ("ray_worker", r"\((?:[A-Za-z_][\w.:]{0,80} )?pid=\d{1,10}"
                   r"(?:, ip=(?P<node>[0-9A-Fa-f.:]{3,45}))?\) "),
    ("ray_daemon", r"\((?:raylet|gcs_server|autoscaler|monitor|dashboard_agent|"
                   r"log_monitor)(?:, ip=(?P<node>[0-9A-Fa-f.:]{3,45}))?\) "),
    # wrappers that name the host or worker: [worker-1] [node-03] [host_2]
    ("worker", r"\[(?P<node>(?:worker|node|host)[-_]?\d{1,6})\] ?"),
    # kubectl logs --prefix: [pod/name/container]
    ("pod", r"\[pod/(?P<node>[a-z0-9][a-z0-9.-]{0,62})/[a-z0-9][a-z0-9-]{0,62}\] ?"),
    # docker compose: "trainer-1  | "
    ("compose", r"(?P<node>[a-z][a-z0-9_.-]{0,30}-\d{1,4}) {1,12}\| "),
)
MAX_STACK = 8  # prefixes stripped from one line at most

_NAMED = re.compile(r"\(\?P<\w+>")


def hs_source(pattern: str) -> str:
    """The pattern with named groups made non-capturing (hyperscan and re2 form)."""
    return _NAMED.sub("(?:", pattern)


# one prefix of any kind, for scanners: anchored rules accept a run of these before the text
PREFIX_ANY = "(?:" + "|".join(hs_source(p) for _, p in PREFIX_KINDS) + ")"
PREFIX_RUN = PREFIX_ANY + "*"
def _combined() -> re.Pattern[str]:
    """All kinds in one alternation (same order: the first kind that matches wins), each
    kind its own group `k<i>` with its rank/node groups renamed `rank<i>` / `node<i>`."""
    alts = []
    for i, (_name, p) in enumerate(PREFIX_KINDS):
        p = p.replace("(?P<rank>", f"(?P<rank{i}>").replace("(?P<node>", f"(?P<node{i}>")
        alts.append(f"(?P<k{i}>{p})")
    return re.compile("|".join(alts), re.ASCII)


_ONE = _combined()
_KIND_NAMES = tuple(name for name, _ in PREFIX_KINDS)
_HAS_RANK = tuple("(?P<rank>" in p for _, p in PREFIX_KINDS)
_HAS_NODE = tuple("(?P<node>" in p for _, p in PREFIX_KINDS)
_ANY_AT_START = re.compile(PREFIX_ANY, re.ASCII)
_OTHER_AT_LINE_START = re.compile(
    "^(?:" + "|".join(hs_source(p) for name, p in PREFIX_KINDS if name != "rank") + ")",
    re.MULTILINE | re.ASCII)


@dataclass(frozen=True, slots=True)
class Normalised:
    """A line without its prefixes, and what they said."""

    text: str
    rank: int | None = None
    node: str | None = None
    stripped: str = ""  # the prefixes as they were, "" when none
    kinds: tuple[str, ...] = ()


def normalise_line(text: str, default_rank: int | None = None) -> Normalised:
    """Strips a run of known prefixes from the start of a line (at most MAX_STACK).

    The innermost rank-carrying prefix gives the rank (`[default0]:[rank3]:` -> 3), the
    innermost node-carrying one the node; `default_rank` when none said.
    """
    if _ANY_AT_START.match(text) is None:
        return Normalised(text, default_rank)
    pos = 0
    rank = default_rank
    node: str | None = None
    kinds: list[str] = []
    match = _ONE.match
    for _ in range(MAX_STACK):
        m = match(text, pos)
        if m is None or m.end() == pos:
            break
        i = int(str(m.lastgroup)[1:])
        if _HAS_RANK[i] and m.group(f"rank{i}") is not None:
            rank = int(m.group(f"rank{i}"))
        if _HAS_NODE[i] and m.group(f"node{i}") is not None:
            node = m.group(f"node{i}")
        kinds.append(_KIND_NAMES[i])
        pos = m.end()
    return Normalised(text[pos:], rank, node, text[:pos], tuple(kinds))


def normalise_batch(joined: str, n: int, default_rank: int | None
                    ) -> tuple[str, list[int | None]] | None:
    """normalise_line() over a newline-joined batch of n lines with C loops: (text without
    prefixes, rank of each line). None when a line holds a newline or a rank prefix sits in
    the middle of a line (merged output): the caller then goes line by line."""
    split = _split_runs(joined, n)
    if split is None:
        return None
    stripped = "\n".join(split[0])[1:]
    if "]:" in stripped and _MID_RANK.search(stripped) is not None:
        return None
    named = _ranks_of_runs(*split, {})
    return stripped, list(map(named.get, range(n), repeat(default_rank)))


# a rank prefix left in a line once its run is stripped: merged output (split line by line)
MID_RANK_PATTERN = r"\[[A-Za-z_]{1,32}?\d{1,7}\]: ?"
_MID_RANK = re.compile(MID_RANK_PATTERN, re.ASCII)


def has_other_prefix(joined: str) -> bool:
    """Whether any line of a newline-joined batch starts with a known prefix other than a
    `[rank3]:` one (those have their own fast strip in prefix.py)."""
    return _OTHER_AT_LINE_START.search(joined) is not None


# for prefix_ranks(): a line start ("\n" before it) and its run of prefixes (group 1); and one
# run tokenised as normalise_line() does it, each rank carrier's number a group of its own
# (`lastindex` is then the innermost carrier's)
_SPLIT_RUNS = re.compile(f"\n({PREFIX_ANY}{{1,{MAX_STACK}}})", re.ASCII)
_RUN_RANK = re.compile("(?:" + "|".join(
    p.replace("(?P<rank>", "(").replace("(?P<node>", "(?:") for _, p in PREFIX_KINDS) + ")*",
    re.ASCII)
_NO_CARRIER = -1
MAX_RUN_CACHE = 4096


def _run_rank(run: str) -> int:
    """The innermost rank a run of prefixes names (normalise_line's), else _NO_CARRIER."""
    m = _RUN_RANK.fullmatch(run)
    if m is None:  # not for a run split off by _SPLIT_RUNS; stay right anyway
        rank = normalise_line(run).rank
        return _NO_CARRIER if rank is None else rank
    return _NO_CARRIER if m.lastindex is None else int(m.group(m.lastindex))


def _split_runs(joined: str, n: int) -> tuple[list[str], list[str], list[int]] | None:
    """(texts between line-start runs of prefixes, the runs, running newline counts of the
    former) for a newline-joined batch of n lines; None when a line holds a newline."""
    parts = _SPLIT_RUNS.split("\n" + joined)
    pieces = parts[0::2]
    runs = parts[1::2]
    nl = list(accumulate(map(str.count, pieces, repeat("\n"))))
    if nl[-1] != n - len(runs):
        return None
    return pieces, runs, nl


def _ranks_of_runs(pieces: list[str], runs: list[str], nl: list[int],
                   cache: MutableMapping[str, int]) -> dict[int, int]:
    """{line index: rank} for the runs that name a rank; a rank is worked out once per
    distinct run (`cache` keeps them across calls, bounded)."""
    if not runs:
        return {}
    new = set(runs).difference(cache)
    if new:
        if len(cache) + len(new) > MAX_RUN_CACHE:
            cache.clear()
            new = set(runs)
        for run in new:
            cache[run] = _run_rank(run)
    rks = list(map(cache.__getitem__, runs))
    at = map(add, nl, range(len(runs)))  # run j starts line nl[j] + j
    keep = list(map(_NO_CARRIER.__ne__, rks))
    return dict(zip(compress(at, keep), compress(rks, keep), strict=False))
