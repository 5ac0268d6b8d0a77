"""Failures: rule hits and non-zero exits, settled, classified and turned into a decision.

Settling is decided in event time (docs/decisions.md, "Failures"): a node's lines precede
its exit and its later heartbeats on the same logs partition, and the matcher keeps that
order per job on the signals topic. So every root error that can matter is in once (a) every node
of the job (nnodes from run-start records if known, else those seen) has exited, or
(b) every node that has not exited sent a heartbeat stamped at least `settle_s` after the
first failure (agent time). (c) A processor-time fallback covers nodes that stopped
heart-beating: `settle_s + node_lost_s` after the failure was seen, only while the shell
says it is caught up. A lagging processor therefore never settles on a cascade because
the culprit's partition is behind.

Classification order: the root error (earliest non-cascade hit, core/root.py); the job's
retryable patterns (policy `retryable_errors` and the SDK's `retryable_errors` notes)
turn a non-hardware failure whose lines contain one of them into a retryable one; then
`fault_tolerant_policy`, max same error, max failure rate (async), budget and storm guard.
A hardware hit starts the settle timer by itself: the node is blacklisted even if the
process hangs instead of exiting.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from faultwatch.core import spares
from faultwatch.core.decide import emit, evidence_ts
from faultwatch.core.events import Decision, Match
from faultwatch.core.policy import Policy
from faultwatch.core.root import default_action, pick_root
from faultwatch.core.state import JobState, Phase

MAX_CONTEXT = 40  # traceback lines carried in a decision's evidence
MAX_EVIDENCE_LINE = 2000  # characters of one line in evidence and messages (a decision stays
# far below the broker's record limit: at most ~50 lines of evidence)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_EVIDENCE_LINE else text[:MAX_EVIDENCE_LINE] + "…"


def settled_by(st: JobState, policy: Policy) -> str | None:
    """Why every node's evidence up to the settle horizon is in (event time), or None."""
    nodes = list(st.nodes.values())
    if not nodes or (st.expected_nodes and len(nodes) < st.expected_nodes):
        return None  # a node that has not shown itself may still be on its way
    if all(n.exit_ts is not None for n in nodes):
        return "all-exited"
    if st.failure_ts is None:
        return None
    horizon = st.failure_ts + policy.settle_s
    if all(n.exit_ts is not None or (n.last_hb_ts is not None and n.last_hb_ts >= horizon)
           for n in nodes):
        return "heartbeats"
    return None


def settle(st: JobState, now: float, policy: Policy, rv: str, *, caught_up: bool = True,
           timer: bool = False) -> tuple[JobState, list[Decision]]:
    """Decide a settling failure once its evidence is complete (see the module doc)."""
    basis = settled_by(st, policy)
    seen = st.failure_seen_at
    if basis is None and timer and seen is not None:
        if st.failure_ts is None and now >= seen + policy.settle_s:
            basis = "processor-time"  # a state written before event-time settling
        elif caught_up and now >= seen + policy.settle_s + policy.node_lost_s:
            basis = "timeout"
    if basis is None:
        return st, []
    conclusive = None
    if basis in ("timeout", "processor-time") and st.failure_ts is not None:
        conclusive = st.failure_ts + policy.settle_s + (
            policy.node_lost_s if basis == "timeout" else 0.0)
    return decide(st, now, policy, rv, ts=evidence_ts(st, now, conclusive), settle={
        "basis": basis, "failure_ts": st.failure_ts,
        "waited_s": None if seen is None else round(max(0.0, now - seen), 3)})


def _retryable_pattern(st: JobState, policy: Policy, root: Match | None) -> str | None:
    patterns = tuple(policy.retryable_errors) + st.retryable
    if not patterns:
        return None
    texts: list[str] = [t.text for t in st.tail]
    for h in st.hits:
        texts.append(h.match.line)
        texts.extend(h.match.context)
    return retryable_in(patterns, texts)


def retryable_in(patterns: Sequence[str], texts: Sequence[str]) -> str | None:
    """The first user pattern (`retryable_errors`, the SDK's) found in any of `texts`."""
    for p in patterns:
        if any(p in t for t in texts):
            return p
    return None


def failure_outcome(root: Match | None, category: str, policy: Policy,
                    retryable: Callable[[], str | None]) -> tuple[str, str, str | None]:
    """(action, category, pattern) of a failure before budgets: the rule's action or the
    policy's for its category; a user's retryable pattern (`retryable()`, asked only when it
    matters) makes a failure that is not hardware a restart. `rules classify` asks it too."""
    action = _failure_action(root, category, policy)
    if category != "hardware" and action not in ("restart", "blacklist") \
            and policy.fault_tolerant_policy != "never":
        pat = retryable()
        if pat is not None:
            return "restart", "retryable", pat
    return action, category, None


# Linux signal numbers a training process dies of (the core imports no `signal`: pure)
_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS",
            8: "SIGFPE", 9: "SIGKILL", 10: "SIGUSR1", 11: "SIGSEGV", 12: "SIGUSR2",
            13: "SIGPIPE", 14: "SIGALRM", 15: "SIGTERM"}


def _signame(sig: int) -> str:
    return _SIGNALS.get(sig, f"signal {sig}")


def decide(st: JobState, now: float, policy: Policy, rv: str,
           settle: dict[str, Any] | None = None, ts: float | None = None
           ) -> tuple[JobState, list[Decision]]:
    matches = [h.match for h in st.hits]
    root = pick_root(matches)
    root_hit = next((h for h in st.hits if h.match is root), None)
    failed = sorted((n for n in st.nodes.values() if n.exit_code not in (None, 0)),
                    key=lambda n: n.exit_ts or 0.0)
    first = failed[0] if failed else None
    category = root.category if root else "unknown"
    rule = root.rule if root else None
    evidence: dict[str, Any] = {
        "exits": {n.node: {"exit_code": n.exit_code, "signal": n.signal, "ts": n.exit_ts}
                  for n in st.nodes.values() if n.exit_ts is not None},
        "matches": [{"node": h.node, "rank": h.match.rank, "rule": h.match.rule,
                     "cascade": h.match.cascade, "ts": h.match.ts, "line": _cut(h.match.line)}
                    for h in st.hits[:10]],
        "expected": st.expected_evidence(),
    }
    if settle is not None:
        evidence["settle"] = settle
    if root is not None and root_hit is not None:
        evidence["first_error"] = {
            "node": root_hit.node, "rank": root.rank, "ts": root.ts, "rule": root.rule,
            "stream": root.stream, "line": _cut(root.line),
            "traceback": [_cut(c) for c in root.context[-MAX_CONTEXT:]],
            "cascade_only": root.cascade}
    if root is None and first is not None:
        evidence["first_error"] = {"node": first.node, "rank": first.rank, "ts": first.exit_ts,
                                   "rule": None, "line": None, "traceback": [],
                                   "exit_code": first.exit_code, "signal": first.signal}
    ranks = (root.rank,) if root is not None and root.rank is not None else ()
    kind = "error" if root is not None and root.stream != "exit" else "exit"
    if root is not None:
        desc = f"{root.rule} ({category})" + (" [cascade only]" if root.cascade else "")
        where = f" on {root_hit.node if root_hit else '?'}"
        where += f" rank {root.rank}" if root.rank is not None else ""
        message = f"{desc}{where}: {_cut(root.line)}"
    elif first is not None:
        how = f"was killed by {_signame(first.signal)} (code {first.exit_code})" \
            if first.signal is not None else f"exited with code {first.exit_code}"
        message = f"{first.node} {how}, no rule matched"
    else:
        message = "a process failed, no rule matched"
    action, category, pat = failure_outcome(root, category, policy,
                                            lambda: _retryable_pattern(st, policy, root))
    if pat is not None:
        evidence["retryable_pattern"] = pat
        message = f"retryable by job pattern {pat!r}: {message}"
    # short failed attempts count against the nodes that failed (suspects)
    short_fails = st.short_fails
    start = min((n.started_ts for n in st.nodes.values()), default=None)
    end = max((n.exit_ts for n in failed if n.exit_ts is not None), default=now)
    if start is not None and end - start < policy.short_attempt_s:
        for n in failed:
            short_fails = short_fails.set(n.node, short_fails.get(n.node, 0) + 1)
        evidence["short_attempt_s"] = round(end - start, 3)
    st = dataclasses.replace(st, short_fails=short_fails)
    if root is not None and action in ("restart", "blacklist"):
        key = f"{root.rule}@{root_hit.node if root_hit else ''}#{root.rank}"
        count = st.same_error.get(key, 0) + 1
        st = dataclasses.replace(st, same_error=st.same_error.set(key, count))
        evidence["same_error_count"] = count
        if count > policy.max_same_error:
            action = "fail"
            message = f"same error {count} times (max {policy.max_same_error}): {message}"
    if action in ("restart", "blacklist") and policy.execution_mode == "async" \
            and policy.max_failure_rate != -1 and len(st.nodes):
        rate = len(failed) / len(st.nodes)
        evidence["failure_rate"] = rate
        if rate > policy.max_failure_rate:
            action = "fail"
            message = f"failure rate {rate:.2f} > {policy.max_failure_rate}: {message}"
    nodes: tuple[str, ...]
    swaps: spares.Swaps = ()
    if action == "blacklist":
        nodes = (root_hit.node,) if root_hit else tuple(n.node for n in failed[:1])
        evidence["restart_nodes"] = sorted(st.nodes) if policy.execution_mode == "sync" \
            else sorted(set(nodes) | {n.node for n in failed})
        swaps, chosen = spares.plan(st, nodes, now, policy)
        if chosen is not None:
            evidence["spares"] = chosen
        if swaps:  # hot spares replace the bad node(s): no requeue (core/spares.py)
            evidence["restart_nodes"] = spares.restart_nodes(st, nodes, swaps, policy)
    elif policy.execution_mode == "async" and action == "restart":
        nodes = tuple(n.node for n in failed)
    else:
        nodes = tuple(sorted(st.nodes))
    out, decs = emit(st, kind, "failure", action, now, policy, rv, nodes=nodes, ranks=ranks,
                     rule=rule, category=category, message=message, evidence=evidence,
                     swaps=swaps, ts=evidence_ts(st, now) if ts is None else ts)
    if action == "notify":  # a rule that only notifies: the failure is not acted upon
        out = dataclasses.replace(out, phase=Phase.DECIDED)
    return out, decs


def _failure_action(root: Match | None, category: str, policy: Policy) -> str:
    if policy.fault_tolerant_policy == "never":
        return "fail"
    if root is not None and root.action:
        return root.action
    if policy.fault_tolerant_policy == "on_failure":
        return "blacklist" if category == "hardware" else "restart"
    return default_action(category) or "fail"
