"""Silence detectors: hang, exit hang and progress stall in event time (heartbeat evidence),
node lost in processor time.

- Hang: every live node's own heartbeat proves its output silent for the window in effect
  (windows.choose_window); before a node's first output the init window applies. A node
  whose heartbeats lag (half the node-lost window behind the freshest one) inhibits the
  hang: node-lost decides about it instead.
- Exit hang: a node exited 0 and the others still run exit_hang_window_s later.
- Progress stall: output keeps flowing, but no rank's step changed for the window.
- Node lost: a live node sent nothing for node_lost_s of processor time; only evaluated when
  the shell says its clock is trustworthy (JobState.tick(live_clock=True)).
- A root error line was printed (a rule hit that is not a cascade): for ERROR_EXIT_GRACE_S
  after it, silence and stalled steps are the failing process's teardown (torchrun is
  silent for seconds while it stops the other ranks), not a hang: the exit that follows
  is decided as the failure. Past the grace a job that printed an error and hangs is hung.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from faultwatch.core import spares
from faultwatch.core.decide import Result, emit, evidence_ts
from faultwatch.core.diagnosis import (
    ANSWER_WAIT_S,
    DIAGNOSE_KIND,
    NONE,
    STUCK,
    Assessment,
    Verdict,
    answers_since,
    assess,
    probes_evidence,
    unchanged_for,
    verdict,
)
from faultwatch.core.pmap import PMap
from faultwatch.core.policy import Policy
from faultwatch.core.state import JobState, NodeState, Phase
from faultwatch.core.windows import (
    DEFAULT_STAGE,
    STEPS_HIST,
    WARMUP_STEPS,
    choose_window,
    describe_basis,
)

ERROR_EXIT_GRACE_S = 60.0  # after a root error line, wait this long for the exit
MAX_PROBES_KEPT = 16  # diagnosis requests a hang's evidence can name


def error_in_flight(st: JobState, now_ev: float) -> bool:
    """A root error was printed less than ERROR_EXIT_GRACE_S ago (its exit is coming)."""
    first = min((h.match.ts for h in st.hits
                 if not h.match.cascade and h.match.stream != "exit"), default=None)
    return first is not None and now_ev - first < ERROR_EXIT_GRACE_S


STALL_MIN_OUTPUTS = 3  # output batches after the last step before output counts as flowing


def check(st: JobState, policy: Policy, rv: str) -> Result:
    """Exit hang, hang, progress stall and missing nodes, in event time (heartbeats)."""
    if st.phase != Phase.RUNNING:
        return st, []
    alive = [n for n in st.nodes.values() if n.alive]
    if not alive or any(n.last_hb_ts is None for n in alive):
        return st, []  # silence is proven by every live node's own heartbeat, or not at all
    now_ev = max(n.last_hb_ts for n in alive if n.last_hb_ts is not None)
    finished = [n for n in st.nodes.values() if n.exit_code == 0 and n.exit_ts is not None]
    if finished and policy.exit_hang_detection:
        first_done = min(n.exit_ts for n in finished if n.exit_ts is not None)
        if now_ev - first_done >= policy.exit_hang_window_s:
            ev = {"finished_nodes": sorted(n.node for n in finished),
                  "finished_at": first_done, "still_running": sorted(n.node for n in alive),
                  "window_s": policy.exit_hang_window_s,
                  "last_lines": st.last_lines_per_rank()}
            first = min(finished, key=lambda n: n.exit_ts or 0.0)
            return emit(st, "exit-hang", "exit-hang", "restart", now_ev, policy, rv,
                           nodes=tuple(sorted(st.nodes)), ranks=(), rule=None, category=None,
                           evidence=ev, message=f"{len(alive)} node(s) still running "
                                                f"{now_ev - first_done:.0f}s after "
                                                f"{first.node} finished")
    stale = now_ev - policy.node_lost_s / 2
    if any(n.last_hb_ts is not None and n.last_hb_ts < stale for n in alive):
        return st, []  # inhibited: a node's heartbeats lag; node-lost decides about it
    if error_in_flight(st, now_ev):
        return st, []  # a failing process is tearing down: its exit decides
    if policy.hang_detection:
        out = _hang(st, alive, now_ev, policy, rv)
        if out is not None:
            return out
    if policy.progress_stall_detection:
        out = _stall(st, now_ev, policy, rv)
        if out is not None:
            return out
    return _missing_nodes(st, now_ev, policy, rv)


def _hang(st: JobState, alive: list[NodeState], now_ev: float, policy: Policy,
          rv: str) -> Result | None:
    window, basis = choose_window(policy, st.open_stages(), st.hists, st.warmed_up)
    if window is None:
        return None  # a stage without hang detection is open (eval)
    silences = []
    held: dict[str, float] = {}  # node -> until when its launcher assembles the job
    frac = float("inf")  # the least silent node's silence, as a fraction of its window
    for n in alive:
        assert n.last_hb_ts is not None
        if n.last_output_ts is None:  # nothing printed yet: imports, rendezvous, restarts
            since, w = n.started_ts, max(policy.effective_init_window_s, window)
        else:
            since, w = n.last_output_ts, window
        if n.start_hold_s is not None and not n.ranked:  # core/start.py
            hold_until = n.started_ts + n.start_hold_s
            if hold_until - since > w:
                w = hold_until - since
                held[n.node] = hold_until
        frac = min(frac, (n.last_hb_ts - since) / w)
        silences.append((since, n))
    silent_since = max(since for since, _ in silences)
    if frac < policy.diagnose_at and \
            now_ev - silent_since < policy.diagnose_at * min(window, policy.hang_floor_s):
        # the common case, checked on every heartbeat: too early for any request (the
        # window's own, a probe's, an extended deadline's: all come at diagnose_at of a
        # window or of the floor, or later) and for any verdict (stacks confirm a hang only
        # after hang_floor_s of silence, the rest only once frac reaches 1)
        return None
    answers = answers_since(st, silent_since) if policy.diagnose else {}
    found = verdict(answers) if answers else None
    until = None  # a rank writes a checkpoint: the decision waits (bounded)
    if found is not None and found.checkpoint:
        seen = max(a["ts"] for a in answers.values())
        until = min(seen + max(window, seen - silent_since),
                    silent_since + max(window, policy.checkpoint_extend_s))
    # A learned window decides on evidence that ranks wait for each other; without it the
    # silence is held to the ceiling (docs/hangs.md). Fixed and stage windows are the user's
    # own word, and the ceiling is the ceiling: silence alone decides them.
    gated = policy.hang_needs_evidence and basis.get("basis") == "adaptive"
    quiet: Assessment | None = None
    proof: Assessment | None = None
    if gated and until is None and frac >= 1.0:
        proof = assess(answers, found, silent_since, policy.stuck_stacks_s)
        if proof.kind == NONE:
            quiet, proof = proof, None
            until = silent_since + max(policy.hang_ceiling_s, window)
    if policy.diagnose:
        ask = _ask(st, now_ev, window, frac, silent_since, until, policy, rv)
        if ask is not None:
            return ask
    confirmed: dict[str, Any] | None = None
    if frac < 1.0 and until is None and found is not None:
        confirmed = _stuck_stacks(answers, found, now_ev - silent_since, silent_since, policy)
    if confirmed is None and (frac < 1.0 or (until is not None and now_ev < until)):
        if until is not None and frac >= 1.0:
            if quiet is not None:
                if _awaiting_answers(st, answers, now_ev, silent_since, window, policy,
                                     ANSWER_WAIT_S):
                    return None  # say what the ranks do once they were seen (or could not be)
                return _held(st, now_ev, silent_since, until, quiet, policy, rv)
            return _deferred(st, now_ev, silent_since, until, found, policy, rv)
        return None
    if _awaiting_answers(st, answers, now_ev, silent_since, window, policy):
        return None  # asked late (heartbeats far apart): give the answers as long as usual
    evidence: dict[str, Any] = {
        "silent_since": silent_since,
        "silent_for_s": round(now_ev - silent_since, 3),
        "window_s": round(window, 3),
        "window": basis,
        "nodes": {n.node: {"last_output_ts": n.last_output_ts,
                           "last_heartbeat_ts": n.last_hb_ts} for _, n in silences},
        "rank_last_output_ts": {str(r): t for r, t in sorted(st.rank_last_ts.items())[:64]},
        "last_lines": st.last_lines_per_rank(),
        "expected": st.expected_evidence(),
    }
    if held:  # the launchers' own start deadlines held the decision back this long
        evidence["start_held_until"] = {k: round(v, 3) for k, v in sorted(held.items())}
    if policy.diagnose:  # the probes of this silence and what they found, in one message
        evidence["probes"] = probes_evidence(st.diag_sent, answers, silent_since)
    msg = f"every rank silent for {now_ev - silent_since:.1f}s (window {window:g}s, " \
          f"{describe_basis(basis)})"
    if confirmed is not None:
        evidence["stacks_unchanged"] = confirmed
        msg += f"; before the window: every rank's stack unchanged for " \
               f"{confirmed['captures_span_s']:.0f}s, the culprits idle"
    if until is not None:
        evidence["extended_until"] = round(until, 3)
    said = False  # the message already says what the ranks do
    if gated:
        last = proof or assess(answers, found, silent_since, policy.stuck_stacks_s)
        evidence["wait_evidence"] = {"kind": last.kind, "sentence": last.sentence,
                                     "ranks": last.ranks, **last.detail}
        if last.kind == STUCK:  # every rank is a culprit: each sits in its own deadlock
            found = Verdict(last.culprits, "stacks unchanged", last.sentence,
                            nodes_of=found.nodes_of if found is not None else {},
                            evidence=found.evidence if found is not None else {})
        elif last.kind == NONE:
            msg += f"; the ceiling ({policy.hang_ceiling_s:g}s) passed with no evidence that " \
                   f"ranks wait for each other: {last.sentence}"
            said = True
    culprits: tuple[int, ...] = ()
    if found is not None:
        evidence["diagnosis"] = found.evidence
        if not said:
            msg += f": {found.sentence}"
        culprits = found.culprits
        if culprits:
            evidence["culprit_basis"] = found.basis
            evidence["culprit_ranks"] = list(culprits[:64])
            hc = st.hang_culprits
            for node in sorted({found.nodes_of[r] for r in culprits if r in found.nodes_of}):
                hc = hc.set(node, hc.get(node, 0) + 1)
            st = dataclasses.replace(st, hang_culprits=hc)
            evidence["culprit_nodes"] = {n: k for n, k in hc.items()
                                         if n in {found.nodes_of.get(r) for r in culprits}}
    if not culprits:
        guess = st.quiet_first()
        evidence["likely_culprit_rank"] = guess
        evidence["culprit_basis"] = "went quiet first (a guess: " + (
            "the stacks named no rank)" if found is not None
            else "no stacks or Flight Recorder dumps arrived)")
        if guess is not None:
            msg += f"; rank {guess} went quiet first (a guess)"
            culprits = (guess,)
    else:
        evidence["likely_culprit_rank"] = culprits[0]
    probes = evidence.get("probes")
    if probes and probes["sent"]:
        msg += f" [{len(probes['sent'])} probe(s) of stacks during the silence, " \
               f"{len(probes['answered'])} node(s) answered]"
    return emit(st, "hang", "hang", "restart", now_ev, policy, rv, nodes=tuple(sorted(st.nodes)),
                ranks=culprits, rule=None, category=None, message=msg, evidence=evidence)


def probe_offsets(limit_s: float, policy: Policy) -> tuple[float, ...]:
    """Silences (seconds) below `limit_s` (where the window's own request comes) at which the
    stacks are captured: diagnose_at x floor, then every hang_floor_s. A window the job's
    cadence taught is short and its own request is about all there is; a long one (the
    ceiling: nothing learned, e.g. a progress bar that draws nothing when the output is no
    terminal; or a deadline a checkpoint write extended) gets probes whose unchanged stacks
    decide once the job is stuck (_stuck_stacks): a stall late in a long silence is seen
    within about two floors. Bounded: limit_s / hang_floor_s requests per silence."""
    return _probe_offsets(limit_s, policy.diagnose_at, policy.hang_floor_s)


@functools.lru_cache(maxsize=1024)  # (a job's window changes rarely; checked every heartbeat)
def _probe_offsets(limit_s: float, diagnose_at: float, floor_s: float) -> tuple[float, ...]:
    out, t = [], diagnose_at * floor_s
    while t < limit_s:
        out.append(t)
        t = (t // floor_s + 1) * floor_s
    return tuple(out)


def _stuck_stacks(answers: dict[str, dict[str, Any]], found: Verdict, silence_s: float,
                  silent_since: float, policy: Policy) -> dict[str, Any] | None:
    """Evidence that the job is stuck before its window ends, or None: the stacks name
    culprits (ranks wait in a collective, the culprits are elsewhere; none loads data or
    writes a checkpoint), every rank's stack stayed the same over captures spanning at least
    hang_floor_s of this silence (the shortest window a cadence may teach), and the culprits
    sat off CPU throughout (diagnosis.unchanged_for)."""
    if found.basis != "stacks" or not found.culprits or silence_s < policy.hang_floor_s:
        return None
    states = found.evidence.get("stacks", {}).get("ranks", {})
    if any(states.get(str(r), {}).get("state") != "elsewhere" for r in found.culprits):
        return None
    span, detail = unchanged_for(answers, silent_since, found.culprits)
    if span < policy.hang_floor_s:
        return None
    return detail


def _ask(st: JobState, now_ev: float, window: float, frac: float, silent_since: float,
         until: float | None, policy: Policy, rv: str) -> Result | None:
    """The `diagnose` request: at the probes (probe_offsets), once when the silence reaches
    diagnose_at of the window, and again before an extended deadline (a checkpoint was
    seen) runs out."""
    silence = now_ev - silent_since
    if until is None:
        due, target = frac >= policy.diagnose_at, silent_since + window
        limit = policy.diagnose_at * window
    else:
        target = until
        due = now_ev >= until - (1 - policy.diagnose_at) * window
        limit = until - silent_since - (1 - policy.diagnose_at) * window
    if not due:
        asked = st.diag_asked if st.diag_asked is not None else float("-inf")
        probes = [o for o in probe_offsets(limit, policy)  # each once, none already covered
                  if o <= silence and asked < silent_since + o]
        due = bool(probes)
        target = silent_since + (probes[-1] if probes else 0.0)
    if not due or (st.diag_for is not None and abs(st.diag_for - target) < 1e-3):
        return None
    st = dataclasses.replace(st, diag_for=target, diag_asked=now_ev)
    st, decs = emit(st, DIAGNOSE_KIND, f"diagnose:{target:.3f}", "notify", now_ev, policy, rv,
                    nodes=tuple(sorted(st.nodes)), ranks=(), rule=None, category=None,
                    message=f"every rank silent for {silence:.1f}s (window {window:g}s): "
                            f"capturing every rank's stack and Flight Recorder dump",
                    evidence={"silent_since": silent_since, "probe_for": round(target, 3),
                              "window_s": round(window, 3)})
    if decs:
        sent = (*st.diag_sent, (decs[0].id, now_ev, round(target, 3)))[-MAX_PROBES_KEPT:]
        st = dataclasses.replace(st, diag_sent=sent)
    return st, decs


def _awaiting_answers(st: JobState, answers: dict[str, Any], now_ev: float, silent_since: float,
                     window: float, policy: Policy, wait_s: float | None = None) -> bool:
    """A request of this silence is out and no node answered yet: wait for the answers as long
    as usual (`wait_s`; by default ANSWER_WAIT_S or what is left of the window after the
    request, whichever is shorter)."""
    if wait_s is None:
        wait_s = min(ANSWER_WAIT_S, (1 - policy.diagnose_at) * window)
    return policy.diagnose and not answers and st.diag_asked is not None \
        and st.diag_asked >= silent_since and now_ev - st.diag_asked < wait_s


def _held(st: JobState, now_ev: float, silent_since: float, until: float, quiet: Assessment,
          policy: Policy, rv: str) -> Result:
    """Once per silence: every rank is silent past the learned window, but nothing shows that
    ranks wait for each other (they compute, do I/O, compile, load data, or were not
    captured): a notice naming what each rank does; the hang waits for the ceiling (or for
    evidence). Like a checkpoint, the silence teaches the window nothing (stage_ts)."""
    st = dataclasses.replace(st, stage_ts=now_ev)
    return emit(st, "hang-deferred", f"quiet:{silent_since:.3f}", "notify", now_ev, policy, rv,
                nodes=tuple(sorted(st.nodes)), ranks=(), rule=None, category=None,
                message=f"every rank silent for {now_ev - silent_since:.1f}s, past the learned "
                        f"window, but {quiet.sentence}: no hang decided before "
                        f"{until - silent_since:.0f}s of silence (the ceiling) unless ranks "
                        f"are seen waiting for each other",
                evidence={"silent_since": silent_since, "extended_until": round(until, 3),
                          "why": "no evidence that ranks wait for each other",
                          "wait_evidence": {"kind": quiet.kind, "sentence": quiet.sentence,
                                            "ranks": quiet.ranks, **quiet.detail}})


def _deferred(st: JobState, now_ev: float, silent_since: float, until: float,
              found: Verdict | None, policy: Policy, rv: str) -> Result | None:
    """Once per silence: say that a checkpoint write holds the hang decision back. The
    silence is a checkpoint, not the job's cadence: like a stage, the gaps spanning it are
    no samples (stage_ts)."""
    assert found is not None
    st = dataclasses.replace(st, stage_ts=now_ev)
    return emit(st, "hang-deferred", f"ckpt:{silent_since:.3f}", "notify", now_ev, policy, rv,
                nodes=tuple(sorted(st.nodes)), ranks=found.checkpoint[:64], rule=None,
                category=None,
                message=f"every rank silent for {now_ev - silent_since:.1f}s, but "
                        f"{found.checkpoint_at} (writing a checkpoint): no hang decided before "
                        f"{until - silent_since:.0f}s of silence (at most "
                        f"{max(policy.checkpoint_extend_s, 0):g}s)",
                evidence={"silent_since": silent_since, "extended_until": round(until, 3),
                          "why": "checkpoint", "checkpoint_ranks": list(found.checkpoint[:64]),
                          "diagnosis": found.evidence})


def _stall(st: JobState, now_ev: float, policy: Policy, rv: str) -> Result | None:
    if st.steps < WARMUP_STEPS or st.step_ts is None or st.last_output_ts is None:
        return None
    hists = PMap({DEFAULT_STAGE: st.hists[STEPS_HIST]} if STEPS_HIST in st.hists else {})
    window, basis = choose_window(policy, st.open_stages(), hists, True)
    if window is None:
        return None
    stalled = now_ev - st.step_ts
    # Output must still be flowing *now* (seen within the last half window), not just a line
    # printed after the last step: a job that went silent right after its last step is hung,
    # and the hang detector decides it (kind `hang`, with the culprit rank).
    # A few lines are no flow: a progress bar's one redraw of the same step (tqdm's monitor
    # thread refreshes a stalled bar once) or a last message before the silence.
    flowing = st.last_output_ts > st.step_ts and now_ev - st.last_output_ts < window / 2 \
        and st.outputs_since_step >= STALL_MIN_OUTPUTS
    if stalled < window or not flowing:
        return None
    last = sorted(st.progress.items(), key=lambda kv: kv[1].ts)[:8]
    evidence: dict[str, Any] = {
        "last_step_ts": st.step_ts, "stalled_for_s": round(stalled, 3),
        "window_s": round(window, 3), "window": basis, "last_output_ts": st.last_output_ts,
        "steps": {str(r): {"step": p.step, "since": p.ts} for r, p in last},
        "last_lines": st.last_lines_per_rank(),
    }
    msg = f"no step advanced for {stalled:.1f}s while output continued (window {window:g}s)"
    return emit(st, "progress-stall", "progress-stall", "restart", now_ev, policy, rv,
                   nodes=tuple(sorted(st.nodes)), ranks=(), rule=None, category=None,
                   message=msg, evidence=evidence)


def _missing_nodes(st: JobState, now_ev: float, policy: Policy, rv: str) -> Result:
    expected = st.expected_nodes
    if not expected or len(st.nodes) >= expected or "missing" in st.flags:
        return st, []
    first = min(n.started_ts for n in st.nodes.values())
    if now_ev - first < policy.skew_warn_s:
        return st, []
    st = dataclasses.replace(st, flags=st.flags | {"missing"})
    missing = expected - len(st.nodes)
    return emit(st, "skew", "missing-nodes", "notify", now_ev, policy, rv, nodes=(), ranks=(),
                   rule=None, category=None,
                   message=f"{missing} of {expected} node(s) not started "
                           f"{now_ev - first:.0f}s after the first",
                   evidence={"expected": st.expected_evidence(), "first_start_ts": first,
                             "started": sorted(st.nodes)})


def check_lost(st: JobState, now: float, policy: Policy, rv: str) -> Result:
    """Node lost: a live node sent nothing for node_lost_s of processor time."""
    lost = [n for n in st.nodes.values() if n.alive and n.seen_at is not None
            and now - n.seen_at >= policy.node_lost_s]
    if not lost:
        return st, []
    names = tuple(sorted(n.node for n in lost))
    evidence: dict[str, Any] = {
        "lost_nodes": {n.node: {"last_heartbeat_ts": n.last_hb_ts, "last_seen_at": n.seen_at,
                                "silent_for_s": round(now - (n.seen_at or now), 3)}
                       for n in lost},
        "window_s": policy.node_lost_s, "last_lines": st.last_lines_per_rank(),
    }
    targets = tuple(sorted(st.nodes)) if policy.execution_mode == "sync" else names
    message = (f"no heartbeat from {', '.join(names)} for "
               f"{now - max(n.seen_at or now for n in lost):.0f}s "
               f"(window {policy.node_lost_s:g}s)")
    swaps, chosen = spares.plan(st, names, now, policy)
    if chosen is not None:
        evidence["spares"] = chosen
    if swaps:  # the lost nodes' places go to hot spares; their agents leave if they return
        targets = tuple(spares.restart_nodes(st, names, swaps, policy))
    # in event time the loss is conclusive a window after the lost nodes' last word
    heard = [t for n in lost for t in (n.started_ts, n.last_output_ts, n.last_hb_ts)
             if t is not None]
    ts = evidence_ts(st, now, max(heard) + policy.node_lost_s if heard else None)
    return emit(st, "node-lost", "node-lost", "restart", now, policy, rv, nodes=targets,
                ranks=(), rule=None, category=None, candidates=names, evidence=evidence,
                message=message, swaps=swaps, ts=ts)
