"""Plain event objects that flow through both stages: lines, rule matches and job signals."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, overload

STDOUT = "stdout"
STDERR = "stderr"
EXIT_STREAM = "exit"

# Line.flags bits
TRUNCATED = 1  # the line was longer than the agent's limit; Line.orig_len holds its length
INVALID_UTF8 = 2  # the bytes were not valid UTF-8 and were decoded with replacement
CR_PROGRESS = 4  # a carriage-return-only update (tqdm bar), kept as a progress line

Category = Literal["retryable", "hardware", "fatal", "unknown"]
CATEGORIES: tuple[str, ...] = ("retryable", "hardware", "fatal")
ACTIONS: tuple[str, ...] = ("restart", "blacklist", "fail", "notify")


class Line(NamedTuple):
    """One line of a child's output as the agent read it (without the newline).

    A NamedTuple rather than a dataclass: it is the hottest object of the pipeline (built
    once per shipped line), and tuple construction is several times cheaper.
    """

    stream: str
    seq: int
    ts: float
    text: str
    flags: int = 0
    orig_len: int = 0


class _LineTimes(Sequence[float]):
    """The times of a plain sequence of Lines, each read when asked for."""

    __slots__ = ("_lines",)

    def __init__(self, lines: Sequence[Line]) -> None:
        self._lines = lines

    def __len__(self) -> int:
        return len(self._lines)

    @overload
    def __getitem__(self, i: int) -> float: ...

    @overload
    def __getitem__(self, i: slice) -> list[float]: ...

    def __getitem__(self, i: int | slice) -> float | list[float]:
        if isinstance(i, slice):
            return [ln.ts for ln in self._lines[i]]
        return self._lines[i].ts


def line_times(lines: Sequence[Line]) -> Sequence[float]:
    """Each line's time: the sequence's own `times` column when it keeps one (a decoded
    record's rows, wire.LineRows: no Line is built for it), else each Line's ts when read."""
    times: Sequence[float] | None = getattr(lines, "times", None)
    return times if times is not None else _LineTimes(lines)


@dataclass(frozen=True, slots=True)
class Match:
    """A rule that matched a line (or an exit status), before it is tied to a job."""

    rule: str
    category: str
    cascade: bool
    ts: float
    line: str
    rank: int | None = None
    stream: str = STDERR
    seq: int = -1
    action: str | None = None
    context: tuple[str, ...] = ()


class TailLine(NamedTuple):
    """A recent line kept as evidence for silence decisions (a NamedTuple, like Line: a job
    stage decodes ~8 of them per output signal, and encodes them as plain lists)."""

    rank: int | None
    ts: float
    text: str


@dataclass(frozen=True, slots=True)
class RunStart:
    """An agent started (or restarted) its child for an attempt of a job."""

    job: str
    attempt: int
    node: str
    ts: float
    run_id: str = ""
    world_size: int | None = None
    nnodes: int | None = None
    rank: int | None = None
    local_ranks: tuple[int, ...] = ()
    host: str = ""
    pid: int = 0
    cmd: tuple[str, ...] = ()
    agent_version: str = ""
    run_source: str = ""  # flag, slurm, torchrun, kubernetes, generated ("": unknown)
    scheduler: dict[str, object] = field(default_factory=dict)  # the scheduler's identity


@dataclass(frozen=True, slots=True)
class Output:
    """A batch of a node's output: liveness per rank and the last lines as evidence."""

    job: str
    attempt: int
    node: str
    ts: float
    count: int
    rank_last_ts: tuple[tuple[int | None, float], ...] = ()
    tail: tuple[TailLine, ...] = ()
    run_id: str = ""


@dataclass(frozen=True, slots=True)
class Hit:
    """A rule match tied to the job, attempt and node it came from."""

    job: str
    attempt: int
    node: str
    match: Match
    run_id: str = ""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The agent's own view of its child, in agent time (event time for hang decisions)."""

    job: str
    attempt: int
    node: str
    ts: float
    alive: bool
    last_output_ts: float | None
    started_ts: float | None = None
    run_id: str = ""


@dataclass(frozen=True, slots=True)
class Exit:
    """The child ended: exit_code as the shell reports it (128+N when killed by signal N)."""

    job: str
    attempt: int
    node: str
    ts: float
    exit_code: int
    signal: int | None = None
    run_id: str = ""
    stopped: bool = False  # the agent stopped the child on an operator's signal: no failure


@dataclass(frozen=True, slots=True)
class Progress:
    """A rank's training step (from a progress rule, or the SDK with its step time)."""

    job: str
    attempt: int
    node: str
    ts: float
    rank: int | None
    step: int
    total: int | None = None
    step_time_s: float | None = None
    source: str = "log"  # "log" (progress rule) or "sdk"
    run_id: str = ""
    loss: float | None = None  # the SDK's `loss` metric of the step (NaN/inf kept)


class RankStep(NamedTuple):
    """One rank's last step in a batch of a node's lines (an entry of a ProgressBatch)."""

    rank: int | None
    ts: float
    step: int
    total: int | None = None


@dataclass(frozen=True, slots=True)
class ProgressBatch:
    """Every rank's last step in one batch of a node's lines (progress rules), in line order:
    the job state folds it as the Progress of each mark in turn, in one state copy."""

    job: str
    attempt: int
    node: str
    marks: tuple[RankStep, ...]
    run_id: str = ""


class RankLoss(NamedTuple):
    """A training-loss value a rank printed (an entry of a LossBatch); NaN/inf included."""

    rank: int | None
    ts: float
    value: float
    key: str = "loss"


@dataclass(frozen=True, slots=True)
class LossBatch:
    """The training-loss values in one batch of a node's lines, in line order (divergence
    evidence: core/divergence.py)."""

    job: str
    attempt: int
    node: str
    marks: tuple[RankLoss, ...]
    run_id: str = ""


@dataclass(frozen=True, slots=True)
class Stage:
    """A rank entered (opens) or left a stage; hang_window_s None: no hang detection in it."""

    job: str
    attempt: int
    node: str
    ts: float
    rank: int | None
    stage: str
    opens: bool
    hang_window_s: float | None = None
    source: str = "log"
    run_id: str = ""
    step: int | None = None  # the step it names (a checkpoint's), when the line or SDK says


@dataclass(frozen=True, slots=True)
class Notice:
    """An agent/SDK notice the job state uses: notify, retryable_errors, bootcheck, gap."""

    job: str
    attempt: int
    node: str
    ts: float
    kind: str
    data: dict[str, object] = field(default_factory=dict)
    run_id: str = ""


Signal = (RunStart | Output | Hit | Heartbeat | Exit | Progress | ProgressBatch | Stage | Notice
          | LossBatch)


def no_budgets() -> dict[str, object]:
    """The budgets of a decision that spends none (a notice): the schema's required fields."""
    return {"restarts_used": 0, "max_restarts": 0}


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do about a job, and why; `id` is deterministic so consumers can dedupe."""

    id: str
    job: str
    attempt: int
    action: str
    kind: str
    ts: float
    nodes: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()
    rule: str | None = None
    category: str | None = None
    message: str = ""
    evidence: dict[str, object] = field(default_factory=dict)
    # a notice spends no budget: zeros, so that every decision carries the schema's fields
    budgets: dict[str, object] = field(default_factory=no_budgets)
    rules_version: str = ""
    run_id: str = ""  # the job run decided about (see RunStart)
    scheduler: dict[str, object] = field(default_factory=dict)  # that run's scheduler identity
    run_ids: tuple[str, ...] = ()  # every run id joined into that run (generated ids), if >1
    # hot spares swapped in by this decision: (the node replaced, the spare replacing it)
    swaps: tuple[tuple[str, str], ...] = ()
