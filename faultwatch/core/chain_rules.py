"""The timeout chain's rows and its nesting rules (pure): `build(inputs)`.

Each rule compares two timers of different parties and says whether the inner one fires
first, and if not what will happen and the fix. A value that cannot be read makes its link
unknown, never a guess. docs/timeouts.md lists the rules.
"""

from __future__ import annotations

from collections.abc import Callable

from faultwatch.core.chain import (
    BROKEN,
    NOTE,
    OK,
    PHASES,
    UNKNOWN,
    Chain,
    Faultwatch,
    Inputs,
    Link,
    Timer,
    fmt_s,
)
from faultwatch.core.start import START_MARGIN_S, start_hold_s
from faultwatch.launch.model import DEFAULT, DERIVED, LEARNED, Setting, unknown
from faultwatch.launch.parse import parse, start_deadline_s


def first_window(fw: Faultwatch) -> Setting:
    """The hang window of a job's first attempt (nothing learned yet): a fixed
    hang_window_s, else the ceiling."""
    p = fw.policy
    if p.hang_window_s is not None:
        return fw.setting("hang_window_s")
    return fw.setting("hang_ceiling_s")


def start_window(inp: Inputs) -> tuple[Setting, float | None]:
    """(the silence the processor allows a node whose ranks have not printed, the part of
    it that is the launcher's deadline read from the command line), as the processor
    computes it (core/silence.py, core/start.py): the command only, no environment."""
    fw = inp.faultwatch
    init = fw.setting("init_window_s", fw.policy.effective_init_window_s)
    win = first_window(fw)
    hold = start_hold_s(inp.launch.argv)
    best = max((init, win), key=lambda s: s.seconds or 0.0)
    if hold is not None and hold > (best.seconds or 0.0):
        return Setting("policy.start_window_s", hold, DERIVED,
                       f"the command's rendezvous deadline + {START_MARGIN_S:g} s "
                       "(core/start.py)"), hold
    return Setting("policy.start_window_s", best.value, best.origin, best.where), hold


def learned_skew(inp: Inputs) -> Setting:
    lr = inp.learned
    if not lr.available:
        return unknown("learned.start_skew_s", lr.why)
    top = lr.max_skew_s
    if top is None:
        return unknown("learned.start_skew_s",
                       f"no start-skew notice in the last {len(lr.runs)} run(s): every start "
                       f"skew stayed below the processor's skew_warn_s "
                       f"({fmt_s(inp.faultwatch.policy.skew_warn_s)} here)")
    n = len(lr.runs)
    return Setting("learned.start_skew_s", top, LEARNED,
                   f"the largest start skew of the last {n} run(s) of this job "
                   f"({len(lr.skews)} notice(s))")


def timers(inp: Inputs) -> list[Timer]:
    """Every party's timers of this launch (unsorted)."""
    la, fw, p = inp.launch, inp.faultwatch, inp.faultwatch.policy
    tool = la.launcher if la.launcher != "unknown" else "launcher"
    rows = [Timer("start", "learned", "start skew between nodes", learned_skew(inp),
                  "the last node starts this long after the first")]
    gate = fw.agent_setting("agent.wait_for_nodes")
    if gate.value:
        rows.append(Timer("start", "faultwatch", f"--wait-for-nodes {gate.value} gate",
                          fw.agent_setting("agent.wait_for_nodes_timeout_s"),
                          "the agents stop waiting for the job's nodes (exit 76)"))
    backend = la.get("rdzv.backend").value
    rows.append(Timer("start", tool, f"rendezvous deadline ({backend or 'unknown backend'})",
                      la.get("rdzv.deadline_s"),
                      "a node waiting this long for the others fails the launch"))
    rows.append(Timer("start", "faultwatch", "start window (no rank has printed)",
                      start_window(inp)[0], "the processor decides a silent start is a hang"))
    win = first_window(fw)
    rows.append(Timer("hang", "faultwatch", "stack probes (diagnose_at x window)",
                      Setting("policy.probe_s", p.diagnose_at * (win.seconds or 0.0),
                              DERIVED, f"diagnose_at {p.diagnose_at:g} x the window "
                                       f"({win.source()})"),
                      "the agents capture every rank's stack and Flight Recorder dump"))
    rows.append(Timer("hang", "faultwatch", "every stack unchanged, no CPU",
                      fw.setting("stuck_stacks_s"), "a hang, before the window"))
    rows.append(Timer("hang", "faultwatch", "hang window, first attempt" if
                      p.hang_window_s is None else "hang window (fixed)", win,
                      "a silence is a hang (learned windows: only with evidence)"))
    if inp.learned.window_s is not None:
        rows.append(Timer("hang", "learned", f"hang window now ({inp.learned.window_basis})",
                          Setting("learned.window_s", inp.learned.window_s, LEARNED,
                                  "the job's status snapshot"), "a silence is a hang"))
    mon = la.get("nccl.enable_monitoring")
    if mon.value is not False:
        rows.append(Timer("hang", "torch NCCL", "heartbeat monitor",
                          la.get("nccl.heartbeat_timeout_s"),
                          "a stuck NCCL watchdog thread aborts the process"))
    rows.append(Timer("hang", "torch NCCL", "collective timeout (watchdog)",
                      la.get("pg.timeout_s.nccl"), "an unfinished collective aborts its "
                      f"communicator (ASYNC_ERROR_HANDLING "
                      f"{la.get('nccl.async_error_handling').value})"))
    rows.append(Timer("hang", "torch gloo", "collective timeout", la.get("pg.timeout_s.gloo"),
                      "an unfinished collective raises in the rank"))
    rows.append(Timer("hang", "faultwatch", "checkpoint hold", fw.setting("checkpoint_extend_s"),
                      "a silence while a rank writes a checkpoint is held this long"))
    rows.append(Timer("failure", "faultwatch", "settle", fw.setting("settle_s"),
                      "the processor waits for other ranks' errors"))
    rows.append(Timer("failure", "faultwatch", "decision wait",
                      fw.agent_setting("agent.decision_wait_s"),
                      "the agent stops waiting for the decision (exit 77)"))
    if la.torchrun is not None:
        rows.append(Timer("failure", "torchrun", "exit barrier",
                          la.get("torchrun.exit_barrier_timeout_s"),
                          "a finished node waits this long for the others"))
    rows.append(Timer("failure", "faultwatch", "exit hang", fw.setting("exit_hang_window_s"),
                      "one node finished, others run on: a hang"))
    if la.torchrun is not None:
        rows.append(Timer("stop", "torchrun", "worker shutdown",
                          la.get("torchrun.shutdown_timeout_s"),
                          "torchrun's SIGTERM -> SIGKILL of its workers"))
    rows.append(Timer("stop", "faultwatch", "agent term grace",
                      fw.agent_setting("agent.term_grace_s"),
                      "the agent's SIGTERM -> SIGKILL of the command"))
    rows.append(Timer("stop", "faultwatch", "agent stop (term grace + exit flush)",
                      _agent_stop(fw), "the agent has flushed its last records and exited"))
    grace = _scheduler_grace(inp)
    if grace is not None:
        rows.append(Timer("stop", inp.scheduler.kind, grace[0], grace[1],
                          "the scheduler SIGKILLs what is left"))
    return rows


def _agent_stop(fw: Faultwatch) -> Setting:
    a, b = fw.agent_setting("agent.term_grace_s"), fw.agent_setting("agent.exit_flush_timeout_s")
    total = (a.seconds or 0.0) + (b.seconds or 0.0)
    return Setting("agent.stop_s", total, DERIVED,
                   f"--term-grace-s {fmt_s(a.seconds)} + --exit-flush-timeout-s "
                   f"{fmt_s(b.seconds)}")


def _scheduler_grace(inp: Inputs) -> tuple[str, Setting] | None:
    sch = inp.scheduler
    if sch.kind == "slurm":
        return "KillWait (SIGTERM -> SIGKILL)", sch.get("slurm.kill_wait_s") or unknown(
            "slurm.kill_wait_s", "not read")
    if sch.kind == "kubernetes":
        return "terminationGracePeriodSeconds", sch.get("k8s.termination_grace_s") or unknown(
            "k8s.termination_grace_s", "not read")
    return None


# ---- the links ---------------------------------------------------------------------------

def _first_link(inp: Inputs) -> list[Link]:
    """faultwatch's own first link: its start window against the launcher's deadline."""
    p, la = inp.faultwatch.policy, inp.launch
    real = start_deadline_s(la)
    win, _ = start_window(inp)
    ws = win.seconds or 0.0
    if not p.hang_detection:
        return [Link("start-window", OK, "hang detection is off: faultwatch never decides "
                                         "a silent start")]
    if la.torchrun is not None and la.torchrun.nnodes_max == 1:
        return [Link("start-window", OK, "a one-node launch waits for no other node")]
    if real is None:
        return [Link("start-window", UNKNOWN,
                     f"faultwatch decides a silent start at {fmt_s(ws)}; the launcher's own "
                     f"deadline is unknown ({la.get('rdzv.deadline_s').where})")]
    says = (f"start window {fmt_s(ws)} ({win.source()}) vs rendezvous deadline "
            f"{fmt_s(real)} ({la.get('rdzv.deadline_s').source()})")
    if ws > real:
        return [Link("start-window", OK, says)]
    if start_deadline_s(parse(la.argv, {})) != real:
        says += "; the processor reads the command line, not the environment"
    return [Link("start-window", BROKEN, says,
                 f"while a node waits for a late one, faultwatch decides a hang at "
                 f"{fmt_s(ws)} and restarts the launch; torchrun would have waited "
                 f"{fmt_s(real)}, and the late node fails against the restarted rendezvous",
                 f"put the rendezvous settings on the command line (--rdzv-conf), or "
                 f"--init-window-s above {fmt_s(real + START_MARGIN_S)}")]


def _skew(inp: Inputs) -> list[Link]:
    """The learned start skew against the rendezvous deadline (the seed's Socket Timeout)."""
    skew = learned_skew(inp)
    real = start_deadline_s(inp.launch)
    fw = inp.faultwatch
    gate = fw.agent_setting("agent.wait_for_nodes")
    if inp.launch.torchrun is not None and inp.launch.torchrun.nnodes_max == 1:
        return []
    if gate.value:
        tmo = fw.agent_setting("agent.wait_for_nodes_timeout_s").seconds or 0.0
        if skew.seconds is None:
            return [Link("start-skew", UNKNOWN, f"--wait-for-nodes gates the launch for "
                         f"{fmt_s(tmo)}; the start skew is {skew.where}")]
        if skew.seconds >= tmo:
            return [Link("start-skew", BROKEN, f"start skew {fmt_s(skew.seconds)} "
                         f"({skew.where}) >= --wait-for-nodes-timeout-s {fmt_s(tmo)}",
                         "the agents give up before the last node arrives (exit 76)",
                         f"raise --wait-for-nodes-timeout-s above {fmt_s(skew.seconds)}")]
        return [Link("start-skew", OK, f"--wait-for-nodes absorbs the start skew "
                     f"{fmt_s(skew.seconds)} (gate {fmt_s(tmo)})")]
    if skew.seconds is None or real is None:
        what = skew.where if skew.seconds is None else "the rendezvous deadline is unknown"
        return [Link("start-skew", UNKNOWN, f"start skew vs rendezvous deadline: {what}")]
    says = (f"rendezvous deadline {fmt_s(real)} vs start skew {fmt_s(skew.seconds)} "
            f"({skew.where})")
    if skew.seconds < real:
        return [Link("start-skew", OK, says)]
    return [Link("start-skew", BROKEN, says,
                 "large launches end in a rendezvous timeout (RendezvousTimeoutError, "
                 "RuntimeError: Socket Timeout) before the first step",
                 f"raise the rendezvous timeout above {fmt_s(skew.seconds)} or use "
                 "--wait-for-nodes")]


def _probes(inp: Inputs) -> list[Link]:
    """faultwatch's stack probes before torch tears the ranks down."""
    fw, la = inp.faultwatch, inp.launch
    win = first_window(fw).seconds or 0.0
    probe = fw.policy.diagnose_at * win
    out = []
    for key, what in (("pg.timeout_s.nccl", "the NCCL collective timeout"),
                      ("nccl.heartbeat_timeout_s", "the NCCL heartbeat monitor")):
        s = la.get(key)
        if key == "nccl.heartbeat_timeout_s" and la.get("nccl.enable_monitoring").value is False:
            continue
        if s.seconds is None:
            out.append(Link(f"probes-vs-{key}", UNKNOWN, f"{what}: {s.where}"))
        elif probe < s.seconds:
            out.append(Link(f"probes-vs-{key}", OK, f"stack probes at {fmt_s(probe)} before "
                            f"{what} {fmt_s(s.seconds)} ({s.source()})"))
        else:
            out.append(Link(f"probes-vs-{key}", BROKEN, f"stack probes at {fmt_s(probe)} >= "
                            f"{what} {fmt_s(s.seconds)} ({s.source()})",
                            "torch tears the ranks down before faultwatch captures their "
                            "stacks: the decision rests on the timeout's error, whose rank "
                            "waited, not the culprit",
                            f"a hang window below {fmt_s(s.seconds / fw.policy.diagnose_at)}"
                            f", or a longer {key.split('.')[0]} timeout"))
    if fw.policy.hang_window_s is None:
        s = la.get("pg.timeout_s.nccl")
        if s.seconds is not None and s.seconds <= win:
            out.append(Link("window-vs-watchdog", NOTE,
                            f"a collective hang in a first attempt ends by torch's timeout "
                            f"({fmt_s(s.seconds)}) before faultwatch's ceiling "
                            f"({fmt_s(win)}): faultwatch decides on its error, with the "
                            "stacks its probes captured"))
    return out


def _backstop(inp: Inputs) -> list[Link]:
    la, p = inp.launch, inp.faultwatch.policy
    aeh = la.get("nccl.async_error_handling")
    if aeh.value != 0 or la.get("nccl.blocking_wait").value:
        return []
    if not p.hang_detection:
        return [Link("backstop", BROKEN, "TORCH_NCCL_ASYNC_ERROR_HANDLING=0 and hang "
                     "detection off", "a hung collective is logged by the watchdog and "
                     "nothing ends it", "drop TORCH_NCCL_ASYNC_ERROR_HANDLING=0 or turn "
                     "hang detection on")]
    return [Link("backstop", NOTE, "TORCH_NCCL_ASYNC_ERROR_HANDLING=0: a hung collective "
                 "is only logged; faultwatch's hang decision ends it")]


def _restarters(inp: Inputs) -> list[Link]:
    n = inp.launch.get("torchrun.max_restarts").value
    if inp.launch.torchrun is None or not isinstance(n, int) or n == 0 \
            or not inp.faultwatch.policy.enable_restart:
        return []
    return [Link("two-restarters", NOTE, f"torchrun --max-restarts {n} restarts the workers "
                 "in place while faultwatch restarts the launch on its decision: a "
                 "failure's first error decides, torchrun's own restarts are cut short",
                 fix="--max-restarts 0 (faultwatch restarts), or --no-restart")]


def _decision_wait(inp: Inputs) -> list[Link]:
    fw = inp.faultwatch
    wait = fw.agent_setting("agent.decision_wait_s").seconds or 0.0
    need = fw.policy.settle_s + 2 * (fw.agent_setting("agent.heartbeat_s").seconds or 0.0)
    says = f"decision wait {fmt_s(wait)} vs settle {fmt_s(fw.policy.settle_s)} + 2 heartbeats"
    if wait > need:
        return [Link("decision-wait", OK, says)]
    return [Link("decision-wait", BROKEN, says, "the agent stops waiting before the "
                 "processor can decide: every failure ends undecided (exit 77)",
                 f"--decision-wait-s above {fmt_s(need)}")]


def _heartbeats(inp: Inputs) -> list[Link]:
    fw = inp.faultwatch
    hb = (fw.agent_setting("agent.heartbeat_s").seconds or 0.0) \
        + (fw.agent_setting("agent.heartbeat_flowing_s").seconds or 0.0)
    half = fw.policy.node_lost_s / 2
    says = f"heartbeats {fmt_s(hb)} (quiet + flowing) vs half of node_lost_s {fmt_s(half)}"
    if hb < half:
        return [Link("heartbeats", OK, says)]
    return [Link("heartbeats", BROKEN, says, "a node that prints steadily can be declared "
                 "lost between two heartbeats", "lower --heartbeat-flowing-s or raise "
                 "--node-lost-s")]


def _worker_stop(inp: Inputs) -> list[Link]:
    """torchrun's (or the framework's) graceful stop inside the agent's term grace."""
    la, fw = inp.launch, inp.faultwatch
    grace = fw.agent_setting("agent.term_grace_s")
    out = []
    if la.get("framework.save_on_sigterm").value:
        who = la.get("framework.save_on_sigterm").where
        saves = inp.learned.checkpoint_silences_s
        if not saves:
            out.append(Link("save-on-sigterm", UNKNOWN,
                            f"{who} saves a checkpoint on SIGTERM within the agent's term "
                            f"grace {fmt_s(grace.seconds)}; how long a save takes is unknown "
                            "(no checkpoint silence recorded)"))
        else:
            status = BROKEN if max(saves) >= (grace.seconds or 0.0) else OK
            out.append(Link("save-on-sigterm", status,
                            f"{who}: a checkpoint kept the ranks silent at least "
                            f"{fmt_s(max(saves))} vs the agent's term grace "
                            f"{fmt_s(grace.seconds)}",
                            "the agent SIGKILLs the ranks while they write the checkpoint",
                            f"--term-grace-s above {fmt_s(max(saves))} (and the scheduler's "
                            "grace above term grace + exit flush)"))
    s = la.get("torchrun.shutdown_timeout_s")
    if la.torchrun is None or s.seconds is None:
        return out
    says = (f"torchrun worker shutdown {fmt_s(s.seconds)} ({s.source()}) vs agent term grace "
            f"{fmt_s(grace.seconds)}")
    if s.seconds < (grace.seconds or 0.0):
        return [*out, Link("worker-stop", OK, says)]
    status = NOTE if s.origin == DEFAULT else BROKEN
    return [*out, Link("worker-stop", status, says,
                       f"the workers get SIGKILL {fmt_s(grace.seconds)} after SIGTERM, not "
                       f"the {fmt_s(s.seconds)} torchrun would give them",
                       "--shutdown-timeout below --term-grace-s")]


def _agent_vs_scheduler(inp: Inputs) -> list[Link]:
    grace = _scheduler_grace(inp)
    if grace is None:
        return []
    name, s = grace
    stop = _agent_stop(inp.faultwatch)
    if s.seconds is None:
        return [Link("agent-vs-scheduler", UNKNOWN, f"agent stop {fmt_s(stop.seconds)} vs "
                     f"{name}: {s.where}")]
    says = (f"agent stop {fmt_s(stop.seconds)} ({stop.where}) vs {inp.scheduler.kind} "
            f"{name.split(' ')[0]} {fmt_s(s.seconds)} ({s.source()})")
    if (stop.seconds or 0.0) < s.seconds:
        return [Link("agent-vs-scheduler", OK, says)]
    return [Link("agent-vs-scheduler", BROKEN, says,
                 "the scheduler SIGKILLs the agent before it flushes: the command's exit and "
                 "last lines stay in the node's spool (sent by the next agent on the node, "
                 "lost with the node)",
                 f"--term-grace-s + --exit-flush-timeout-s below {fmt_s(s.seconds)}, or a "
                 f"longer {name.split(' ')[0]}")]


def _checkpoint_interval(inp: Inputs) -> list[Link]:
    """A hang costs the work since the last checkpoint: the window against the interval."""
    steps = inp.launch.get("checkpoint.interval_steps")
    if not steps.known:
        return []
    win = first_window(inp.faultwatch)
    return [Link("window-vs-checkpoint", UNKNOWN,
                 f"a checkpoint every {steps.value} steps ({steps.where}) vs the hang window "
                 f"{fmt_s(win.seconds)}: the interval in seconds is unknown (step times are "
                 "not kept across runs)")]


LINKS: tuple[Callable[[Inputs], list[Link]], ...] = (
    _first_link, _skew, _probes, _backstop, _restarters, _decision_wait, _heartbeats,
    _checkpoint_interval, _worker_stop, _agent_vs_scheduler)


def _order(t: Timer) -> tuple[int, float]:
    s = t.setting.seconds
    return PHASES.index(t.phase), s if s is not None else float("inf")


def build(inputs: Inputs) -> Chain:
    """The chain of these inputs: the timers sorted by phase and value (the order they
    fire), unknown values last in their phase, and every rule's links."""
    rows = tuple(sorted(timers(inputs), key=_order))
    links = tuple(link for rule in LINKS for link in rule(inputs))
    return Chain(rows, links, inputs)
