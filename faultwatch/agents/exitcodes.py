"""The exit-code contract of `faultwatch agent` and `faultwatch run`, and the verdict behind it.

The agent never passes its child's exit code through: it exits only with one of the codes
below, each meaning one thing, so a child that exits 138 by itself or dies by SIGUSR1 can
never look like "run me elsewhere". The child's own code and signal are reported beside the
verdict: in the decision's evidence (`exits`), in the verdict file (`--verdict-out`) and in
one line on stderr. docs/cli.md has the table; docs/schedulers.md what each scheduler does
with each code, and why these numbers:

- 138 is the code Kubeflow documents for a user-defined retryable error, and its
  training-operator retries it (`IsRetryableExitCode` in v1.8.1: every code >= 128; earlier
  releases 130, 137, 143 and 138), so "this node is bad, run me elsewhere" is 138. The agent handles
  SIGUSR1 (forwards it to the child) so that it never dies by SIGUSR1 itself.
- 75-78 are far from what a Python process or a shell produce by themselves (1, 2, 126,
  127, 128+N for signal N up to 192 for real-time signals, 255), and are permanent for
  Kubeflow, so only an explicit rule (Slurm `RequeueExit`, a Job's `podFailurePolicy`, a
  shell `case`) makes them retry.
- 128+N (129, 130, 143) only when the agent itself received SIGHUP, SIGINT or SIGTERM (it
  forwarded it and its child stopped): what schedulers already expect of a stopped process.
- 1-9 are faultwatch's own errors (faultwatch/errors.py), as for every other command.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

VERDICT_VERSION = 1

EXIT_SUCCESS = 0  # the command succeeded (and no decision stopped it)
EXIT_RESTART = 75  # a restart decision for this node, with --on-restart exit: relaunch me here
EXIT_NODES_TIMEOUT = 76  # --wait-for-nodes: the job's other agents did not come up in time
EXIT_UNDECIDED = 77  # the command failed and no decision was acted on (none within the wait)
EXIT_FAILED = 78  # a `fail` decision: permanent, do not retry
EXIT_ELSEWHERE = 138  # this node is bad (blacklist decision, failed boot check): run elsewhere

# name -> code; `interrupted` is 128+N for the signal N the agent received (SIGHUP 129,
# SIGINT 130, SIGTERM 143), `error` the class's code of faultwatch's own error (1-9).
# `replaced` (a hot spare took this node's place: the job runs on without it) and `released`
# (a spare whose run ended without needing it) exit 0 too: nothing for the scheduler to do,
# and 0 leaves a step's or a Job's result to the nodes still training (srun returns the
# highest code of its tasks, a Job succeeds when its pods do).
VERDICTS: dict[str, int] = {
    "success": EXIT_SUCCESS, "restart": EXIT_RESTART, "elsewhere": EXIT_ELSEWHERE,
    "failed": EXIT_FAILED, "undecided": EXIT_UNDECIDED, "nodes-timeout": EXIT_NODES_TIMEOUT,
    "replaced": EXIT_SUCCESS, "released": EXIT_SUCCESS,
}
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # the agent stops on these
RESERVED = frozenset(VERDICTS.values()) | {128 + int(s) for s in STOP_SIGNALS}


def signal_name(sig: int | None) -> str | None:
    if sig is None:
        return None
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def describe_child(code: int | None, sig: int | None) -> str:
    """`exited with code 3`, `was killed by SIGUSR1 (code 138)`, or `never ran`."""
    if code is None:
        return "never ran"
    if sig is not None:
        return f"was killed by {signal_name(sig)} (code {code})"
    return f"exited with code {code}"


@dataclass(frozen=True)
class Verdict:
    """Why the agent exits with `exit_code`; the verdict file is its to_dict()."""

    verdict: str  # a VERDICTS name, "interrupted" or "error"
    exit_code: int
    why: str = ""
    child_exit_code: int | None = None  # the last attempt's command; None: it never ran
    child_signal: int | None = None
    decision: dict[str, Any] | None = None  # id, action, kind, rule, message of the decision
    job: str = ""
    node: str = ""
    run_id: str = ""
    attempt: int = 0
    next_attempt: int | None = None  # restart: the attempt the relaunched agent must pass
    agent_signal: int | None = None  # interrupted: the signal the agent received
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "v": VERDICT_VERSION, "verdict": self.verdict, "exit_code": self.exit_code,
            "why": self.why,
            "child": {"exit_code": self.child_exit_code, "signal": self.child_signal,
                      "signal_name": signal_name(self.child_signal)},
            "decision": self.decision, "job": self.job, "node": self.node,
            "run_id": self.run_id, "attempt": self.attempt}
        if self.next_attempt is not None:
            out["next_attempt"] = self.next_attempt
        if self.agent_signal is not None:
            out["agent_signal"] = signal_name(self.agent_signal)
        out.update(self.extra)
        return out

    def sentence(self, component: str = "agent", story: Story | None = None) -> str:
        """One line for stderr, the run's closing summary: what happened (with `story`: the
        attempts, restarts and decisions), the verdict, its code, the child's own exit and
        the why."""
        head = f"faultwatch {component}: "
        if story is not None:
            head += f"{story.headline(self)}; "
        parts = [head + f"verdict {self.verdict} (exit {self.exit_code})"]
        parts.append(f"command {describe_child(self.child_exit_code, self.child_signal)}")
        if self.decision is not None:
            d = self.decision
            parts.append(f"decision {d.get('action')} {d.get('id')} ({d.get('kind')}"
                         + (f", rule {d['rule']}" if d.get("rule") else "") + ")")
        if self.why:
            parts.append(self.why)
        parts.append(f"job {self.job} attempt {self.attempt} run {self.run_id}")
        return "; ".join(parts)


_OUTCOME = {"success": "succeeded", "failed": "failed", "restart": "restart requested",
            "elsewhere": "this node is bad, run elsewhere", "undecided": "failed, undecided",
            "nodes-timeout": "the other nodes did not come up", "interrupted": "interrupted",
            "error": "faultwatch error", "replaced": "replaced by a hot spare",
            "released": "released (the run ended without needing this spare)"}


@dataclass
class Story:
    """What a run's agent lived through, for the closing summary: each decision it read (its
    kind, targets and time since the agent started) and which ones it acted on."""

    started_ts: float
    decisions: list[tuple[Any, str]] = field(default_factory=list)  # (Decision, verdict)
    restarts: int = 0

    def add(self, dec: Any, verdict: str) -> None:
        self.decisions.append((dec, verdict))

    def cause(self, dec: Any) -> str:
        """`hang of rank 1 at 12.3 s` / `error on node n2 at 4.0 s`."""
        ranks = ",".join(str(r) for r in dec.ranks)
        nodes = ",".join(str(n) for n in dec.nodes)
        who = (f" of rank{'s' if len(dec.ranks) > 1 else ''} {ranks}" if ranks
               else f" on {nodes}" if nodes else "")
        at = max(0.0, float(dec.ts) - self.started_ts)
        return f"{dec.kind}{who} at {at:.1f} s"

    def headline(self, v: Verdict) -> str:
        """`succeeded in attempt 1 after 1 restart (error of rank 1 at 33.1 s); 1 decision`."""
        acted = [d for d, verdict in self.decisions if verdict not in ("ignored", "notify")]
        out = f"{_OUTCOME.get(v.verdict, v.verdict)} in attempt {v.attempt}"
        if self.restarts:
            out += f" after {self.restarts} restart{'s' if self.restarts > 1 else ''}"
        if acted:
            out += " (" + ", ".join(self.cause(d) for d in acted[:3]) \
                + (f", {len(acted) - 3} more" if len(acted) > 3 else "") + ")"
        n = len(self.decisions)
        return out + f"; {n or 'no'} decision{'' if n == 1 else 's'}"


def decision_summary(dec: Any) -> dict[str, Any]:
    """What a verdict says of the decision it follows (a core.events.Decision)."""
    return {"id": dec.id, "action": dec.action, "kind": dec.kind, "rule": dec.rule,
            "attempt": dec.attempt, "message": str(dec.message)[:500]}


def write_verdict(path: Path, v: Verdict) -> None:
    """Write the verdict file atomically (a reader never sees half of it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(orjson.dumps(v.to_dict()) + b"\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
