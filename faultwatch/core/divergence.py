"""Divergence: a training loss that became NaN/inf, or spiked, read from the ranks' output.

Evidence comes as loss values the matcher read from the frameworks' own log lines
(`LossBatch`, rules/loss.py) or the SDK's progress metrics (`Progress.loss`). Per attempt the
state keeps the last `loss_window` finite values (any rank); a finite value above
`loss_spike_factor` x their median (once at least LOSS_MIN_SAMPLES are in, median > 0) is a
spike. A NaN/inf loss is a divergence.

What happens (policy): `divergence_action` for NaN/inf and `loss_spike_action` for spikes,
each `notify` (default: a `notify` decision of kind `divergence`, the job runs on), `restart`
(the job restarts and resumes from its last checkpoint; restart budget and storm guard
apply), or `fail`. One NaN/inf decision per attempt; at most MAX_SPIKES spike decisions per
attempt. Nothing is decided once the attempt is decided. Time is the lines' (event time).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from faultwatch.core.decide import Result, emit
from faultwatch.core.events import Decision, RankLoss
from faultwatch.core.policy import Policy
from faultwatch.core.state import JobState, Phase

LOSS_MIN_SAMPLES = 8  # finite losses needed before a spike can be called
MAX_SPIKES = 5  # spike decisions per attempt
NAN_FLAG = "divergence:nan"
SPIKE_FLAG = "divergence:spike:"


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2.0


def _fmt(v: float) -> str:
    return f"{v:.6g}"


def on_losses(st: JobState, node: str, marks: Iterable[RankLoss], policy: Policy,
              rv: str) -> Result:
    """Fold a node's loss values (in line order) into the state; decide divergence."""
    if not policy.divergence_detection or st.phase != Phase.RUNNING:
        return st, []
    recent = list(st.losses)
    decs: list[Decision] = []
    for m in marks:
        v = m.value
        if not math.isfinite(v):
            if NAN_FLAG in st.flags:
                continue
            med = _median(recent) if recent else None
            st = dataclasses.replace(st, flags=st.flags | {NAN_FLAG}, losses=tuple(recent))
            st, d = _decide(st, node, m, "nan", policy.divergence_action, med, policy, rv)
            decs += d
        else:
            med = _median(recent) if len(recent) >= LOSS_MIN_SAMPLES else None
            if med is not None and med > 0 and v > policy.loss_spike_factor * med:
                k = sum(1 for f in st.flags if f.startswith(SPIKE_FLAG))
                if k < MAX_SPIKES:
                    st = dataclasses.replace(st, flags=st.flags | {f"{SPIKE_FLAG}{k}"},
                                             losses=tuple(recent))
                    st, d = _decide(st, node, m, f"spike:{k}", policy.loss_spike_action, med,
                                    policy, rv)
                    decs += d
            recent.append(v)
            if len(recent) > policy.loss_window:
                del recent[:len(recent) - policy.loss_window]
        if st.phase != Phase.RUNNING:  # restarted or failed: this attempt is over
            return st, decs
    return dataclasses.replace(st, losses=tuple(recent)), decs


def _decide(st: JobState, node: str, m: RankLoss, episode: str, action: str,
            median: float | None, policy: Policy, rv: str) -> Result:
    rank = m.rank
    where = f"rank {rank} on {node}" if rank is not None else node
    if episode == "nan":
        what = f"loss is {_fmt(m.value)} ({m.key})"
        kind_txt = "diverged"
    else:
        assert median is not None
        what = (f"loss spiked to {_fmt(m.value)} ({m.key}), "
                f"{m.value / median:.1f}x the median {_fmt(median)} of the last "
                f"{min(len(st.losses), policy.loss_window)} values")
        kind_txt = "spiked"
    then = {"notify": "", "restart": "; restarting from the last checkpoint",
            "fail": "; failing the job"}[action]
    evidence = {"loss": str(m.value) if not math.isfinite(m.value) else m.value,
                "key": m.key, "rank": rank, "node": node, "ts": m.ts,
                "median": median, "window": policy.loss_window,
                "factor": policy.loss_spike_factor if episode != "nan" else None,
                "what": kind_txt, "action_policy": action}
    if action == "restart":
        evidence["resume"] = "last checkpoint"
    nodes = (node,) if action == "notify" else tuple(sorted(st.nodes)) or (node,)
    ranks = (rank,) if rank is not None and rank >= 0 else ()
    return emit(st, "divergence", episode, action, m.ts, policy, rv, nodes=nodes,
                ranks=ranks, rule=None, category="divergence",
                message=f"training {kind_txt} on {where}: {what}{then}", evidence=evidence)
