"""The job stage's node gate (pure, time passed in): signals in, signals out. A run-start on a
quarantined node, a failed boot check and a node whose checks are the odd ones out of its job
become hardware hits that core decides like any hardware rule hit (settle, blacklist, budget);
a node whose all-reduce is far slower than the others' becomes a suspect (a bootcheck note).
A hot spare's note gets the registry's state of its node stamped on it (core/spares.py reads
it when it chooses a spare); a waiting spare's own check note blames no job.

Check notes are shipped before the child launches, so before the run-start of their attempt
(which the job state needs first): the gate holds a node's verdict until that node's
run-start of the same attempt, or passes it on at once when that attempt already runs (on
this node or another one: a node that aborts on a failed check never sends its own).
What the gate remembers is bounded and in memory (a processor restart forgets pending check
verdicts of attempts in flight; the registry itself is on its topic)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from faultwatch.core.events import Hit, Match, Notice, RunStart, Signal
from faultwatch.core.quota import RUN_STARTS, NodeQuota
from faultwatch.core.registry import HEALTHY, QUARANTINED, NodeRecord
from faultwatch.registry.checks import blames_node, checks_of, compare_nodes, failed_checks

QUARANTINED_RULE = "node-quarantined"  # the run-start came from a quarantined node
CHECK_FAILED_RULE = "bootcheck-failed"  # a boot/after-failure check failed on the node
CHECK_ODD_RULE = "bootcheck-odd-node"  # versions/GPUs unlike the job's other nodes
BOOTCHECK = "bootcheck"
SPARE = "spare"  # a hot spare's note (and `when` of a waiting spare's check note)
HARDWARE = "hardware"
MAX_KEYS = 4096  # jobs x nodes x attempts remembered (oldest forgotten first)
MAX_LINE = 1500

Quarantined = Callable[[str, float], NodeRecord | None]
RegistryState = Callable[[str, float], str]


def _iso(ts: float | None) -> str:
    if ts is None:
        return "?"
    return datetime.fromtimestamp(int(ts), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def quarantine_line(rec: NodeRecord) -> str:
    """What a job starting on a quarantined node is told: until when, and why."""
    why = next((r for r in reversed(rec.reasons) if r.event == "quarantine"), None)
    reason = ""
    if why is not None:
        reason = f": {why.rule or 'manual'}"
        if why.line:
            reason += f" ({why.line})"
        elif why.decision:
            reason += f" (decision {why.decision})"
    return (f"faultwatch registry: node {rec.node} is quarantined until {_iso(rec.until)} "
            f"({rec.strikes} strike(s)){reason}")[:MAX_LINE]


def _hit(job: str, attempt: int, node: str, run_id: str, rule: str, ts: float, line: str,
         stream: str) -> Hit:
    return Hit(job, attempt, node, Match(rule=rule, category=HARDWARE, cascade=False, ts=ts,
                                         line=line[:MAX_LINE], stream=stream,
                                         action="blacklist"), run_id=run_id)


def failed_check_line(node: str, failed: list[dict[str, Any]]) -> str:
    parts = [f"{c['name']}: {str(c.get('detail') or 'failed')[:300]}" for c in failed[:8]]
    return f"bootcheck failed on {node}: " + "; ".join(parts)


def odd_node_line(node: str, finding: dict[str, Any]) -> str:
    return (f"bootcheck on {node}: {finding['check']} is {finding.get('value')!r}, the job's "
            f"other nodes have {finding.get('expected')!r} ({finding.get('basis')})")


class NodeGate:
    """Called by the job stage on each record's signals before they are applied. With a
    quota (core/quota.py), a node's run-starts beyond it are refused here (`refused` is
    called with the run-start, for the shell to count and log)."""

    def __init__(self, quarantined: Quarantined | None = None,
                 state: RegistryState | None = None, quota: NodeQuota | None = None,
                 refused: Callable[[RunStart, str], None] | None = None) -> None:
        self.quarantined = quarantined
        self.state = state  # the registry's state of a node (None: from `quarantined`)
        self.quota = quota
        self.refused = refused
        self.started: OrderedDict[tuple[str, str], tuple[int, str]] = OrderedDict()
        self.job_started: OrderedDict[str, tuple[int, str]] = OrderedDict()  # last run-start
        self.pending: OrderedDict[tuple[str, str, int], list[Signal]] = OrderedDict()
        # (job, attempt) -> node -> (its rank, its checks, the run id of its note)
        self.notes: OrderedDict[tuple[str, int],
                                dict[str, tuple[int | None, list[Any], str]]] = OrderedDict()
        self.reported: OrderedDict[tuple[str, int, str, str], None] = OrderedDict()

    def __call__(self, sigs: Iterable[Signal], now: float) -> list[Signal]:
        out: list[Signal] = []
        quota = self.quota
        for sig in sigs:
            if isinstance(sig, RunStart):
                if quota is not None and not quota.take(RUN_STARTS, sig.node, sig.ts, now):
                    if self.refused is not None:
                        self.refused(sig, RUN_STARTS)
                    continue
                out.append(sig)
                out += self._on_start(sig, now)
                continue
            out.append(sig)
            if isinstance(sig, Notice) and sig.kind == SPARE:
                out[-1] = self._stamp(sig, now)
            elif isinstance(sig, Notice) and sig.kind == BOOTCHECK \
                    and not (isinstance(sig.data, dict) and sig.data.get("when") == SPARE):
                out += self._on_checks(sig)
        return out

    def _stamp(self, sig: Notice, now: float) -> Notice:
        """A spare's note with the registry's state of its node (whatever the note said)."""
        if self.state is not None:
            state = self.state(sig.node, now)
        else:
            quarantined = self.quarantined is not None and \
                self.quarantined(sig.node, now) is not None
            state = QUARANTINED if quarantined else HEALTHY
        data = dict(sig.data) if isinstance(sig.data, dict) else {}
        data["registry"] = state
        return Notice(sig.job, sig.attempt, sig.node, sig.ts, sig.kind, data, run_id=sig.run_id)

    # ---- run-starts ---------------------------------------------------------------------

    def _on_start(self, sig: RunStart, now: float) -> list[Signal]:
        _put(self.started, (sig.job, sig.node), (sig.attempt, sig.run_id))
        _put(self.job_started, sig.job, (sig.attempt, sig.run_id))
        out: list[Signal] = []
        rec = self.quarantined(sig.node, now) if self.quarantined is not None else None
        if rec is not None:
            out.append(_hit(sig.job, sig.attempt, sig.node, sig.run_id, QUARANTINED_RULE,
                            sig.ts, quarantine_line(rec), "registry"))
        for held in self.pending.pop((sig.job, sig.node, sig.attempt), []):
            out.append(_with_run(held, sig.run_id))
        return out

    # ---- check notes --------------------------------------------------------------------

    def _on_checks(self, sig: Notice) -> list[Signal]:
        data = sig.data if isinstance(sig.data, dict) else {}
        verdicts: list[tuple[str, Signal]] = []
        failed = [c for c in failed_checks(data) if blames_node(c)]
        if failed:
            verdicts.append((sig.node, _hit(sig.job, sig.attempt, sig.node, sig.run_id,
                                            CHECK_FAILED_RULE, sig.ts,
                                            failed_check_line(sig.node, failed), BOOTCHECK)))
        rank = data.get("node_rank")
        rank = rank if type(rank) is int else data.get("rank")  # rank-mode agents
        group = self.notes.get((sig.job, sig.attempt)) or {}
        group[sig.node] = (rank if type(rank) is int else None, checks_of(data), sig.run_id)
        _put(self.notes, (sig.job, sig.attempt), group)
        verdicts += self._compare(sig, group)
        out: list[Signal] = []
        for node, verdict in verdicts:
            started = self.started.get((sig.job, node))
            if started is None or started[0] != sig.attempt:
                # the job runs this attempt on other nodes: the verdict applies now (this
                # node may never start: --bootcheck-abort exits before its run-start), with
                # the run id of the node's own note: never another node's, which would let a
                # node's note land in a run it is not in (core/runs.py decides on its own id)
                other = self.job_started.get(sig.job)
                own = group.get(node)
                started = (sig.attempt, own[2] if own is not None else sig.run_id) \
                    if other is not None and other[0] == sig.attempt else None
            if started is not None:
                out.append(_with_run(verdict, started[1]))
            else:
                held = self.pending.get((sig.job, node, sig.attempt)) or []
                _put(self.pending, (sig.job, node, sig.attempt), held + [verdict])
        return out

    def _compare(self, sig: Notice, group: dict[str, tuple[int | None, list[Any], str]]
                 ) -> list[tuple[str, Signal]]:
        if len(group) < 2:
            return []
        ranked = sorted((r, n) for n, (r, _, _) in group.items() if r is not None)
        reference = ranked[0][1] if ranked else None
        findings = compare_nodes({n: checks for n, (_, checks, _) in group.items()},
                                 reference=reference)
        out: list[tuple[str, Signal]] = []
        for f in findings:
            key = (sig.job, sig.attempt, f["node"], f["check"])
            if key in self.reported:
                continue
            _put(self.reported, key, None)
            node = f["node"]
            if f["check"] == "allreduce":  # slow is tolerated: the node becomes a suspect
                line = (f"bootcheck on {node}: all-reduce bus bandwidth {f['busbw_gb_s']:g} "
                        f"GB/s, below {f['slow_fraction']:g} x the job's median "
                        f"{f['median_gb_s']:g} GB/s")
                out.append((node, Notice(sig.job, sig.attempt, node, sig.ts, BOOTCHECK, {
                    "ok": False, "compared": True,
                    "checks": [{"name": "allreduce-compared", "ok": False, "status": "fail",
                                "value": f["values"], "detail": line}]}, run_id=sig.run_id)))
            else:
                out.append((node, _hit(sig.job, sig.attempt, node, sig.run_id,
                                       CHECK_ODD_RULE, sig.ts, odd_node_line(node, f),
                                       BOOTCHECK)))
        return out


def _with_run(sig: Signal, run_id: str) -> Signal:
    """A held verdict, carrying the run id of the node's run-start (the state's run)."""
    if isinstance(sig, Hit):
        return Hit(sig.job, sig.attempt, sig.node, sig.match, run_id=run_id)
    if isinstance(sig, Notice):
        return Notice(sig.job, sig.attempt, sig.node, sig.ts, sig.kind, sig.data,
                      run_id=run_id)
    return sig


def _put(d: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    d[key] = value
    d.move_to_end(key)
    while len(d) > MAX_KEYS:
        d.popitem(last=False)
