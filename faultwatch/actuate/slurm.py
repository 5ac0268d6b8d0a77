"""Slurm actuator: drain/resume nodes and requeue jobs with `scontrol` (argv lists, no shell)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from faultwatch.actuate.backend import ActuateError, Option
from faultwatch.actuate.plan import QUARANTINE, RELEASE, REQUEUE, Action
from faultwatch.registry.names import SLURM_JOB_ID_RE, check, valid_job, valid_node

REASON_PREFIX = "faultwatch "
# job states in which the job no longer holds its nodes' allocation for this run
PENDING_STATES = {"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD"}

# scontrol's answers that a retry cannot change
PERMANENT_ERRORS = ("Invalid node name", "Invalid job id", "Access/permission denied",
                    "Invalid user id", "Invalid job id specified")

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def drain_reason(action: Action) -> str:
    return f"{REASON_PREFIX}{action.decision}: {action.rule or 'unknown'}"


def parse_show(text: str) -> dict[str, str]:
    """`scontrol show ... -o` (one line of Key=Value) as a dict; Reason= runs to the end of
    the line when it is not one-line output."""
    out: dict[str, str] = {}
    for tok in text.split():
        if "=" in tok:
            k, _, v = tok.partition("=")
            out.setdefault(k, v)
    if "Reason=" in text:
        rest = text.split("Reason=", 1)[1]
        # one-line output: the reason ends where the next Key= starts
        words: list[str] = []
        for w in rest.split(" "):
            if words and "=" in w and w.split("=", 1)[0].isalpha():
                break
            words.append(w)
        out["Reason"] = " ".join(words).strip()
    return out


class SlurmBackend:
    """quarantine -> `scontrol update nodename=N state=drain reason="faultwatch <id>: <rule>"`;
    requeue -> `scontrol requeue <jobid>` when the job still holds the node; release ->
    `scontrol update nodename=N state=resume`, only for a node faultwatch drained."""

    name = "slurm"

    def __init__(self, scontrol: str = "scontrol", squeue: str = "squeue",
                 env: dict[str, str] | None = None, timeout_s: float = 30.0,
                 runner: Runner = subprocess.run) -> None:
        self.scontrol, self.squeue = scontrol, squeue
        self.env, self.timeout_s, self._run = env, timeout_s, runner

    def _call(self, argv: Sequence[str], ok_codes: tuple[int, ...] = (0,)) -> str:
        try:
            r = self._run(list(argv), capture_output=True, text=True, env=self.env,
                          timeout=self.timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ActuateError(f"{argv[0]} failed to run: {e}") from None
        if r.returncode not in ok_codes:
            out = (r.stderr or r.stdout).strip()
            raise ActuateError(f"{' '.join(argv)} exited {r.returncode}: {out[:300]}",
                               permanent=any(p in out for p in PERMANENT_ERRORS))
        return str(r.stdout)

    def apply(self, action: Action) -> str:
        node = valid_node(action.node)
        if action.kind == QUARANTINE:
            self.one_node(node)
            self._call([self.scontrol, "update", f"nodename={node}", "state=drain",
                        f"reason={drain_reason(action)}"])
            return f"drained {node}"
        if action.kind == RELEASE:
            return self._resume(node)
        if action.kind == REQUEUE:
            return self._requeue(node, action)
        raise ActuateError(f"slurm: unknown action kind {action.kind!r}")

    def one_node(self, node: str) -> dict[str, str]:
        """slurmctld's record of `node` when it reads the name as exactly that node, else a
        permanent ActuateError. A name that passes valid_node may still be read as other or
        more nodes by `scontrol update nodename=`: a NodeSet name (`gpus` drained both nodes
        of a node set on the test slurmctld) or a NodeHostname (`localhost` drained n1).
        `show node` answers those with "not found" and lists with several records, so one
        record named `node` is the check (tests/e2e/test_slurm.py asks the real slurmctld)."""
        argv = [self.scontrol, "show", "node", node, "-o"]
        try:
            r = self._run(argv, capture_output=True, text=True, env=self.env,
                          timeout=self.timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ActuateError(f"{argv[0]} failed to run: {e}") from None
        out = f"{r.stdout or ''}\n{r.stderr or ''}"
        records = [parse_show(line) for line in (r.stdout or "").splitlines()
                   if line.startswith("NodeName=")]
        names = [rec.get("NodeName", "") for rec in records]
        if names == [node]:
            return records[0]
        if names or "not found" in out:
            raise ActuateError(f"slurm: node name {node!r} is read by Slurm as "
                               f"{', '.join(names) if names else 'no node of that name'} "
                               "(a node set, a host name or a list?): refused",
                               permanent=True)
        raise ActuateError(f"slurm: {' '.join(argv)} gave no node record: {out.strip()[:200]}")

    def _resume(self, node: str) -> str:
        info = self.one_node(node)
        state = info.get("State", "")
        if "DRAIN" not in state:
            return f"{node} not drained ({state or 'unknown state'})"
        if not info.get("Reason", "").startswith(REASON_PREFIX):
            return f"{node} drained by someone else ({info.get('Reason', '')!r}): left alone"
        self._call([self.scontrol, "update", f"nodename={node}", "state=resume"])
        return f"resumed {node}"

    def job_ids(self, node: str, action: Action) -> list[str]:
        """The Slurm jobs of the decision: the run's SLURM_JOB_ID when the decision carries
        it, else the jobs on the node whose Slurm job name is the faultwatch job name."""
        if action.scheduler.get("kind") == "slurm" and action.scheduler.get("job_id"):
            return [check("job_id", action.scheduler["job_id"], SLURM_JOB_ID_RE)]
        if not action.job:
            return []
        name = valid_job(action.job)
        # --name takes a comma list: keep only the jobs whose whole name is ours
        out = self._call([self.squeue, "-h", "-t", "all", "-w", node, f"--name={name}",
                          "-o", "%i %j"])
        ids = []
        for row in out.splitlines():
            jid, _, jname = row.strip().partition(" ")
            if jid and jname == name:
                ids.append(check("job_id", jid, SLURM_JOB_ID_RE))
        return ids

    def _requeue(self, node: str, action: Action) -> str:
        ids = self.job_ids(node, action)
        if not ids:
            return f"no Slurm job of {action.job!r} on {node}"
        how = "job id from the decision" if action.scheduler.get("job_id") else \
            f"Slurm job name {action.job!r} on {node}"
        done = []
        for jid in ids:
            info = parse_show(self._call([self.scontrol, "show", "job", jid, "-o"]))
            state = info.get("JobState", "")
            if not state:
                done.append(f"{jid}: unknown to Slurm")
                continue
            if state in PENDING_STATES:
                done.append(f"{jid}: already {state.lower()}")
                continue
            hosts = self._hostnames(info.get("NodeList", ""))
            if node not in hosts:
                done.append(f"{jid}: no longer on {node} (on {','.join(hosts) or 'none'})")
                continue
            self._call([self.scontrol, "requeue", jid])
            done.append(f"{jid}: requeued (was {state.lower()} on {node})")
        return "; ".join(done) + f" [{how}]"

    def _hostnames(self, nodelist: str) -> list[str]:
        if not nodelist or nodelist in ("(null)", "None"):
            return []
        out = self._call([self.scontrol, "show", "hostnames", nodelist])
        return [h.strip() for h in out.split() if h.strip()]


NAME = "slurm"
TITLE = "slurm"
OPTIONS = (Option("--scontrol", "scontrol executable", "scontrol"),
           Option("--squeue", "squeue executable", "squeue"))


def build(opts: Mapping[str, Any]) -> SlurmBackend:
    return SlurmBackend(scontrol=opts["scontrol"], squeue=opts["squeue"])
