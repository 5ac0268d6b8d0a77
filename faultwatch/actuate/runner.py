"""`faultwatch actuate`'s middle: decisions and node records in, actions (journaled) out;
planned, deduped, limited, re-checked against the registry, confirmed, run (the Kafka loop
around it is service.py)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faultwatch.actuate.backend import ActuateError, Backend
from faultwatch.actuate.confirm import confirm
from faultwatch.actuate.journal import Journal
from faultwatch.actuate.limits import ActuateLimits, DrainLimiter
from faultwatch.actuate.plan import QUARANTINE, RELEASE, REQUEUE, Action, plan_decision, plan_node
from faultwatch.actuate.recheck import stale
from faultwatch.core.events import Decision
from faultwatch.core.registry import (
    QUARANTINED,
    NodeRecord,
    Registry,
    RegistryPolicy,
    registry_updates,
)
from faultwatch.errors import ConfigError, DecodeError, FaultwatchError
from faultwatch.eventlog import log_event
from faultwatch.trust.intake import DecisionIntake, fresh, where_of
from faultwatch.trust.refusals import REFUSALS
from faultwatch.trust.replay import DEFAULT_MAX_AGE_S, REPLAYED, ReplayGuard
from faultwatch.trust.versions import describe, older
from faultwatch.wire import decode_node


@dataclass(frozen=True)
class ActuateConfig:
    bootstrap: str
    prefix: str
    state_file: Path
    group: str
    write_registry: bool = False  # also derive registry updates (the job stage writes them)
    max_decision_age_s: float = DEFAULT_MAX_AGE_S
    poll_ms: int = 500
    retry_s: float = 5.0
    max_tries: int = 5
    registry_policy: RegistryPolicy = RegistryPolicy()
    limits: ActuateLimits = ActuateLimits()
    fleet_nodes: int = 0  # the fleet's size when the registry knows fewer (healthy nodes
    #                       that never had a record are not on it)
    hold_summary_s: float = 300.0  # while holding: one line this often with the count
    nodes_retry_s: float = 10.0  # the nodes topic missing or not authorised: ask this often


def hold_file(state_file: Path) -> Path:
    """Written while drains are held: which nodes, why, how to release."""
    return state_file.with_name(state_file.name + ".hold")


def release_file(state_file: Path) -> Path:
    """Created by `faultwatch actuate --release-hold`: the running actuator releases the hold."""
    return state_file.with_name(state_file.name + ".release")


class Actuator:
    """The pure-ish middle: decisions and node records in, actions (journaled) out."""

    def __init__(self, backend: Backend, journal: Journal, cfg: ActuateConfig,
                 replay: ReplayGuard | None = None) -> None:
        self.backend, self.journal, self.cfg = backend, journal, cfg
        # the replay rule: a decision acts once (across restarts: beside the journal) and
        # only within the maximum age
        self.replay = replay or ReplayGuard("decision", cfg.max_decision_age_s, log=log_event)
        self.registry: Registry = {}
        self.queue: deque[tuple[Action, int, float]] = deque()  # action, tries, not before
        self.queued: set[str] = set()
        self.limiter = DrainLimiter(cfg.limits)
        self.held: dict[str, Action] = {}  # key -> action held by the limits, in order
        self.held_since: float | None = None
        self.held_why = ""
        self._next_hold_summary = 0.0
        self._unlimited: set[str] = set()  # keys an operator released from a hold
        # what was done, for the acted topic (reports show it on the incident's timeline)
        self.acted: deque[tuple[Action, str, float]] = deque(maxlen=10_000)
        self.acted_failing = False
        self._refused: dict[str, str] = {}  # node -> the error last logged for it
        # keys refused for want of a scheduler identity (a processor's registry record of a
        # blacklist names the job, not its Slurm id or pod): the blacklist decision itself,
        # read after it, carries the identity and is confirmed afresh
        self._unidentified: set[str] = set()
        self._drops_logged = 0  # in this pass of run_due (a released hold drops many)
        for a in journal.pending.values():  # begun before a crash: replay (re-checked first)
            log_event("actuate_replay", key=a.key)
            self._enqueue(a, replay=True)

    def _enqueue(self, a: Action, replay: bool = False) -> None:
        if a.key in self.queued:
            if a.scheduler:  # the same action, now with the scheduler identity to confirm it
                for i, (q, tries, not_before) in enumerate(self.queue):
                    if q.key == a.key and not q.scheduler:
                        self.queue[i] = (a, tries, not_before)
            return
        if not replay and self.journal.is_done(a.key) and not (
                a.scheduler and a.key in self._unidentified):
            return
        self._unidentified.discard(a.key)
        self.queued.add(a.key)
        self.queue.append((a, 0, 0.0))

    def take_decision(self, value: bytes | None, now: float, gate: Any, *, topic: str,
                      partition: int, offset: int) -> list[NodeRecord]:
        """One decisions-topic record: signature (gate), decode, the replay rule, plan."""
        dec = DecisionIntake(gate, self.replay, log_event).decode(
            value, topic=topic, partition=partition, offset=offset)
        return [] if dec is None else self.on_decision(dec, now, where_of(topic, partition,
                                                                          offset))

    def take_node(self, value: bytes | None, now: float, gate: Any, *, topic: str,
                  partition: int, offset: int, plan: bool = True) -> None:
        """One nodes-topic record: signature (gate; tombstones are refused with a trust
        file, ignored without), decode, its version, then plan (not while the registry is
        read at start: then only each node's latest record is planned, plan_registry)."""
        if not gate.admit_value(value, topic=topic, partition=partition, offset=offset):
            return
        if value is None:
            return
        try:
            rec = decode_node(value)
        except DecodeError as e:
            log_event("undecodable_record", topic=topic, partition=partition, offset=offset,
                      error=str(e))
            return
        held = self.registry.get(rec.node)
        if getattr(gate, "verifying", False) and held is not None and older(
                held.version, rec.version):
            gate.refuse(REPLAYED, f"node {rec.node!r}: {describe(rec.version)} after "
                        f"{describe(held.version)} (an old record written again)",
                        topic=topic, partition=partition, offset=offset)
            return
        self.on_node(rec, now, plan=plan)

    def on_decision(self, dec: Decision, now: float, where: str) -> list[NodeRecord]:
        """Plan a decision's actions; return the registry records it changes (to publish)."""
        if not fresh(self.replay, dec, now, log_event, where, where=where):
            return []
        try:
            actions = plan_decision(dec)
        except ConfigError as e:
            log_event("actuate_decision_rejected", decision=dec.id[:80], where=where,
                      error=str(e))
            return []
        ups: list[NodeRecord] = []
        if actions and self.cfg.write_registry:
            ups = registry_updates(dec, self.registry, now, self.cfg.registry_policy)
            for rec in ups:
                self.registry[rec.node] = rec
        for a in actions:
            self._enqueue(a)
        return ups

    def on_node(self, rec: NodeRecord, now: float, plan: bool = True) -> None:
        self.registry[rec.node] = rec
        self._prune_held(rec.node, now)
        if plan:
            self._plan_node(rec, now)

    def plan_registry(self, now: float) -> None:
        """After the registry was read at start: act on each node's latest record (never on
        its history: drain, resume, drain... of a state file that is new or lost)."""
        for rec in list(self.registry.values()):
            self._plan_node(rec, now)

    def _plan_node(self, rec: NodeRecord, now: float) -> None:
        try:
            for a in plan_node(rec, now):
                self._enqueue(a)
        except ConfigError as e:
            if self._refused.get(rec.node) != str(e):  # once per entry and error, not per tick
                self._refused[rec.node] = str(e)
                log_event("actuate_node_rejected", node=rec.node[:80], error=str(e))
            return
        self._refused.pop(rec.node, None)

    def seed_drained(self, now: float) -> None:
        """After the registry is read: the nodes faultwatch drained before a restart count
        toward the limits (their quarantine is done in the journal)."""
        for rec in self.registry.values():
            try:
                acts = plan_node(rec, now)
            except ConfigError:
                continue
            if any(a.kind == QUARANTINE and self.journal.is_done(a.key) for a in acts):
                self.limiter.drained(rec.node, now)

    def _prune_held(self, node: str, now: float) -> None:
        """A newer record of `node` arrived: held actions it overtook leave the hold (an
        operator who releases held nodes drops their drains)."""
        gone = [(k, why) for k, a in self.held.items() if a.node == node
                for why in [stale(a, self.registry, now)] if why is not None]
        if not gone:
            return
        for k, _why in gone:
            a = self.held.pop(k)
            self._unlimited.discard(k)
            self.journal.drop(a, _why)
        log_event("actuate_hold_dropped", node=node, actions=len(gone), why=gone[0][1],
                  still_held=len(self.held_nodes()))
        if self.held:
            self._write_hold()
            return
        log_event("actuate_hold_ended", why="every held action was overtaken by the registry",
                  since_s=round(now - (self.held_since or now)))
        self.held_since = None
        hold_file(self.cfg.state_file).unlink(missing_ok=True)

    def _drop(self, a: Action, why: str) -> None:
        """A queued action the registry overtook: not run, not done (see Journal.drop)."""
        self.queued.discard(a.key)
        self._unlimited.discard(a.key)
        self.journal.drop(a, why)
        self._drops_logged += 1
        if self._drops_logged <= 5:
            log_event("actuate_dropped", backend=self.backend.name, kind=a.kind, node=a.node,
                      decision=a.decision, why=why)

    def _refuse_requeue(self, a: Action, refusal: str) -> None:
        """The drain of `a` was refused (not_allocated): the requeue of the same decision on
        that node must not run either (the job does not run there)."""
        rq = Action(REQUEUE, a.node, a.decision, a.rule, a.job, a.scheduler, a.ts)
        if rq.key in self.queued or rq.key in self.held:
            self.queued.discard(rq.key)
            self.held.pop(rq.key, None)
            self.journal.done(rq, f"refused: its drain was refused ({refusal[:200]})")

    def _hold(self, a: Action, why: str, now: float) -> None:
        first = not self.held
        self.held[a.key] = a
        self.queued.discard(a.key)
        if first:
            self.held_since, self.held_why = now, why
            self._next_hold_summary = now + self.cfg.hold_summary_s
            log_event("actuate_hold", backend=self.backend.name, why=why,
                      nodes=",".join(self.held_nodes())[:500],
                      release=self._release_cmd())
        self._write_hold()

    def _release_cmd(self) -> str:
        return (f"faultwatch actuate --backend {self.backend.name} --state-file "
                f"{self.cfg.state_file} --release-hold")

    def held_nodes(self) -> list[str]:
        return list(dict.fromkeys(a.node for a in self.held.values() if a.kind == QUARANTINE))

    def _write_hold(self) -> None:
        import orjson

        path = hold_file(self.cfg.state_file)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(orjson.dumps({
            "since": self.held_since, "why": self.held_why, "nodes": self.held_nodes(),
            "actions": len(self.held),
            "release": self._release_cmd()},
            option=orjson.OPT_INDENT_2))
        tmp.replace(path)

    def check_release(self, now: float) -> int:
        """An operator asked to release the hold: the held actions run (beyond the limits),
        counting starts afresh. Returns how many actions were released."""
        rel = release_file(self.cfg.state_file)
        if not rel.exists():
            if self.held and now >= self._next_hold_summary:
                self._next_hold_summary = now + self.cfg.hold_summary_s
                log_event("actuate_holding", nodes=len(self.held_nodes()),
                          actions=len(self.held), since_s=round(now - (self.held_since or now)),
                          release=self._release_cmd())
            return 0
        held = list(self.held.values())
        log_event("actuate_hold_released", nodes=len(self.held_nodes()), actions=len(held))
        self.held.clear()
        self.held_since = None
        self.limiter.reset()
        for a in held:
            self._unlimited.add(a.key)
            self._enqueue(a)
        for f in (rel, hold_file(self.cfg.state_file)):
            f.unlink(missing_ok=True)
        return len(held)

    def _limit(self, a: Action, now: float) -> str | None:
        """Why this action must wait (the drain limits), or None."""
        if a.key in self._unlimited:
            return None
        if a.kind == REQUEUE and any(h.node == a.node and h.kind == QUARANTINE
                                     for h in self.held.values()):
            return "its node's drain is held"
        if a.kind != QUARANTINE:
            return None
        if self.held:
            return self.held_why  # one hold: later drains wait behind the first held one
        known = max(self.cfg.fleet_nodes, len(self.registry.keys() | {a.node}))
        return self.limiter.why_not(a.node, known, now)

    def tick(self, now: float) -> None:
        """Quarantines that expired since: release them (keyed by their end time)."""
        for rec in list(self.registry.values()):
            if rec.state == QUARANTINED and rec.until is not None and now >= rec.until:
                self.on_node(rec, now)

    def run_due(self, now: float) -> int:
        """Run every queued action that is due, in order, through the stages: due (a requeue
        waits for its drain) -> still planned (re-checked against its node's latest registry
        record, recheck.py) -> limits (else held) -> journal begin -> confirm -> apply ->
        journal done (or retry); returns how many ran."""
        ran = 0
        self._drops_logged = 0
        for _ in range(len(self.queue)):
            a, tries, not_before = self.queue.popleft()
            if not self._due(a, tries, not_before, now) or not self._planned(a, now) or \
                    not self._within_limits(a, now):
                continue
            if a.key not in self.journal.pending:
                self.journal.begin(a)
            try:
                if not self._confirmed(a):
                    continue
                result = self.backend.apply(a)
            except (ActuateError, FaultwatchError) as e:
                self._failed(a, tries + 1, e, now)
                continue
            self._applied(a, result, now)
            ran += 1
        if self._drops_logged > 5:
            log_event("actuate_dropped_summary", dropped=self._drops_logged, logged=5)
        return ran

    def _due(self, a: Action, tries: int, not_before: float, now: float) -> bool:
        """Still queued and due; a requeue waits for its node's drain (else back in line)."""
        if a.key not in self.queued:
            return False  # dropped meanwhile (its drain was refused)
        if not_before > now or (a.kind == REQUEUE and Action(
                QUARANTINE, a.node, a.decision).key in self.queued):
            self.queue.append((a, tries, not_before))
            return False
        return True

    def _planned(self, a: Action, now: float) -> bool:
        """Not overtaken by its node's latest registry record (else dropped)."""
        overtaken = stale(a, self.registry, now)
        if overtaken is not None:
            self._drop(a, overtaken)
            return False
        return True

    def _within_limits(self, a: Action, now: float) -> bool:
        """The drain limits allow it now (else held)."""
        why = self._limit(a, now)
        if why is not None:
            self._hold(a, why, now)
            return False
        return True

    def _confirmed(self, a: Action) -> bool:
        """The scheduler runs the job on the node (confirm.py); a refusal is journaled."""
        refusal = confirm(self.backend, a)
        if refusal is None:
            return True
        if not a.scheduler:
            self._unidentified.add(a.key)
        REFUSALS[("actuate", "not_allocated")] += 1
        log_event("actuate_refused", reason="not_allocated", backend=self.backend.name,
                  kind=a.kind, node=a.node, decision=a.decision, job=a.job, detail=refusal)
        self.journal.done(a, f"refused: {refusal}")
        self.queued.discard(a.key)
        self._refuse_requeue(a, refusal)
        return False

    def _failed(self, a: Action, tries: int, e: Exception, now: float) -> None:
        """A failed apply: journaled as failed (permanent) or given up, else retried later."""
        if getattr(e, "permanent", False):
            log_event("actuate_failed", backend=self.backend.name, kind=a.kind,
                      node=a.node, decision=a.decision, tries=tries,
                      cause=str(e), retry="no (a permanent error)")
            self.journal.done(a, f"failed: {e}")
            self.queued.discard(a.key)
            self._unlimited.discard(a.key)
        elif tries >= self.cfg.max_tries:
            log_event("actuate_gave_up", backend=self.backend.name, kind=a.kind,
                      node=a.node, decision=a.decision, tries=tries, error=str(e))
            self.journal.done(a, f"gave up: {e}")
            self.queued.discard(a.key)
        else:
            log_event("actuate_retry", backend=self.backend.name, kind=a.kind,
                      node=a.node, decision=a.decision, tries=tries, error=str(e))
            self.queue.append((a, tries, now + self.cfg.retry_s * 2 ** (tries - 1)))

    def _applied(self, a: Action, result: str, now: float) -> None:
        """Journal done; the limits count it; the acted topic gets it."""
        self.journal.done(a, result)
        self.queued.discard(a.key)
        self._unlimited.discard(a.key)
        if a.kind == QUARANTINE:
            self.limiter.drained(a.node, now)
        elif a.kind == RELEASE:
            self.limiter.resumed(a.node)
        self.acted.append((a, str(result), time.time()))
        log_event("actuated", backend=self.backend.name, kind=a.kind, node=a.node,
                  decision=a.decision, rule=a.rule, job=a.job, result=result)
