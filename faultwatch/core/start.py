"""The start of an attempt: how long a node may stay silent while its launcher assembles the job.

A multi-node torchrun waits for the job's other nodes up to its own rendezvous deadline
(static: `timeout`, 900 s; c10d/etcd-v2: `join_timeout`, 600 s; docs/timeouts.md), silent
or printing only its own banner. A hang decided before that deadline restarts a launch that
was legitimately waiting for a late node, and the restart kills the rendezvous the late node
then joins (measured: docs/timeouts.md, "The first link"). So until one of its ranks prints,
a node whose command is such a launch is given its launcher's deadline plus START_MARGIN_S
(the launcher's own error line and exit, which decide the failure) from its start, whatever
the hang window. The deadline is read from the command line the agent sends in its RunStart
(launch.parse, no environment: a value set only in PET_RDZV_CONF is not seen; `faultwatch
check` says so).
"""

from __future__ import annotations

from collections.abc import Sequence

from faultwatch.launch import parse, start_deadline_s

START_MARGIN_S = 30.0  # after the launcher's own deadline: its error line, its exit
MAX_START_HOLD_S = 86400.0  # a RunStart cannot hold a node's hang decision back longer


def start_hold_s(cmd: Sequence[str]) -> float | None:
    """Seconds from a node's start during which its silence is its launcher's rendezvous:
    the launch's own deadline + START_MARGIN_S for a launch of more than one node (or an
    unknown count), bounded by MAX_START_HOLD_S; None when the command says no deadline
    (not torchrun, one node, or a value that cannot be read)."""
    if not cmd:
        return None
    launch = parse(cmd, {}, training=False)
    tr = launch.torchrun
    if tr is None or tr.nnodes_max == 1:
        return None
    deadline = start_deadline_s(launch)
    if deadline is None or deadline < 0:
        return None
    return min(deadline + START_MARGIN_S, MAX_START_HOLD_S)
