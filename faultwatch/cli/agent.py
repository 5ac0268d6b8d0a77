"""`faultwatch agent` (and `agent tail`, `agent bootcheck`): its flags, and the flags turned
into an AgentConfig."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from faultwatch import settings
from faultwatch.agents.config import (
    EXIT_BLACKLISTED,
    EXIT_BOOTCHECK_FAILED,
    EXIT_FAILED,
    EXIT_NODES_TIMEOUT,
    EXIT_RESTART,
    EXIT_UNDECIDED,
    FIRST_LINGER_MS,
    LINGER_MS,
    MAX_LINGER_MS,
    AgentConfig,
)
from faultwatch.cli import options
from faultwatch.cli.commands import AGENT_SUBCOMMANDS
from faultwatch.errors import ConfigError


def _follow_decisions(args: argparse.Namespace) -> bool:
    """Node mode acts on decisions by default; rank mode (one agent per rank) does not."""
    if args.follow_decisions is not None:
        return bool(args.follow_decisions)
    env = settings.FOLLOW_DECISIONS.get()
    if env is not None:
        return env
    rank_mode = args.rank is not None or "RANK" in os.environ
    return not rank_mode


def _attempt(args: argparse.Namespace) -> int:
    if args.attempt is not None:
        return int(args.attempt)
    return settings.ATTEMPT.value()


def bootcheck_kw(args: argparse.Namespace) -> dict[str, Any]:
    """The boot-check settings of `agent` and `agent bootcheck`."""
    return dict(bootcheck_paths=tuple(args.bootcheck_path),
                bootcheck_min_mb_s=args.bootcheck_min_mb_s,
                bootcheck_expect_gpus=args.bootcheck_expect_gpus,
                bootcheck_allreduce=args.bootcheck_allreduce,
                bootcheck_timeout_s=args.bootcheck_timeout_s)


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    """The agent's configuration from the parsed flags; `args.cmd` is the command after --."""
    cmd = list(args.cmd)
    if not cmd and not args.flush:
        raise ConfigError("cmd", "no command given: faultwatch agent --job J -- CMD [ARGS...]")
    if not args.job:
        raise ConfigError("job", f"--job is required (or ${settings.JOB})")
    from faultwatch.metrics import check_address_file

    check_address_file(getattr(args, "metrics_address_file", None),
                       getattr(args, "metrics_port", None))
    return AgentConfig.from_env_defaults(
        bootstrap=args.bootstrap, job=args.job, node=args.node, cmd=tuple(cmd),
        topic_prefix=args.topic_prefix, attempt=_attempt(args), heartbeat_s=args.heartbeat_s,
        heartbeat_flowing_s=args.heartbeat_flowing_s,
        spool_dir=args.spool_dir, rank=args.rank, nnodes=args.nnodes,
        term_grace_s=args.term_grace_s, exit_flush_timeout_s=args.exit_flush_timeout_s,
        max_line_bytes=args.max_line_bytes, spool_cap_bytes=args.spool_cap_mb << 20,
        linger_ms=args.linger_ms, follow_decisions=_follow_decisions(args),
        decision_wait_s=args.decision_wait_s,
        sdk=args.sdk, wait_for_nodes=args.wait_for_nodes,
        wait_for_nodes_timeout_s=args.wait_for_nodes_timeout_s, bootcheck=args.bootcheck,
        bootcheck_abort=args.bootcheck_abort, run_id=getattr(args, "run_id", None),
        labels=tuple(getattr(args, "label", None) or ()),
        metrics_port=getattr(args, "metrics_port", None),
        verdict_out=_path(getattr(args, "verdict_out", None)),
        decisions_out=_path(getattr(args, "decisions_out", None)),
        on_restart=getattr(args, "on_restart", None) or "relaunch",
        node_key_file=getattr(args, "node_key_file", None),
        metrics_address=getattr(args, "metrics_address", None) or "127.0.0.1",
        metrics_address_file=getattr(args, "metrics_address_file", None),
        spare=bool(getattr(args, "spare", False)), spares=_spares(args),
        node_index=getattr(args, "node_index", None),
        nodes_total=getattr(args, "nodes_total", None),
        spare_note_s=float(getattr(args, "spare_note_s",
                                   options.default_of(AgentConfig, "spare_note_s"))),
        **bootcheck_kw(args))


def _spares(args: argparse.Namespace) -> int:
    if getattr(args, "spares", None) is not None:
        return int(args.spares)
    return settings.SPARES.value()


def _path(v: str | None) -> Path | None:
    return Path(v) if v else None


# ---- commands -----------------------------------------------------------------------------

def cmd_agent(args: argparse.Namespace) -> int:
    from faultwatch.agents.entry import main_sync
    from faultwatch.readers.render import render_decision

    cfg = config_from_args(args)
    if not args.flush and not args.no_check:
        from faultwatch.eventlog import set_component

        set_component("agent")
        _check(args, cfg)
    return main_sync(cfg, flush_only=bool(args.flush), render=render_decision)


def _check(args: argparse.Namespace, cfg: AgentConfig) -> None:
    """The timeout chain once before the launch (cli/check.py), with the agent's own timers;
    the policy is the processor's, which the agent does not know: its defaults stand in."""
    from faultwatch import __version__
    from faultwatch.cli import check
    from faultwatch.core.chain import AGENT_DEFAULTS
    from faultwatch.core.policy import Policy

    values = {"term_grace_s": cfg.term_grace_s, "exit_flush_timeout_s": cfg.exit_flush_timeout_s,
              "decision_wait_s": cfg.decision_wait_s, "heartbeat_s": cfg.heartbeat_s,
              "heartbeat_flowing_s": cfg.heartbeat_flowing_s,
              "wait_for_nodes": cfg.wait_for_nodes,
              "wait_for_nodes_timeout_s": cfg.wait_for_nodes_timeout_s}
    given = {d: v != AGENT_DEFAULTS[check.AGENT_FLAGS[d]] for d, v in values.items()}
    fw = check.Faultwatch(Policy(), {}, check.agent_settings(values, given), __version__)
    check.preflight(cfg.cmd, fw, strict=args.strict, component="agent",
                    policy_note="; policy: faultwatch's defaults, the processor's may differ")


def cmd_agent_tail(args: argparse.Namespace) -> int:
    from faultwatch.agents.tail import tail_main

    cfg = AgentConfig.from_env_defaults(
        bootstrap=args.bootstrap, job=args.job, node=args.node, cmd=("tail",),
        topic_prefix=args.topic_prefix, attempt=args.attempt or 0, heartbeat_s=args.heartbeat_s,
        spool_dir=args.spool_dir, exit_flush_timeout_s=args.exit_flush_timeout_s,
        spool_cap_bytes=args.spool_cap_mb << 20, max_line_bytes=args.max_line_bytes,
        linger_ms=args.linger_ms)
    return tail_main(cfg, args.paths, Path(args.state_file) if args.state_file else None,
                     args.poll_s, args.from_end)


def cmd_agent_bootcheck(args: argparse.Namespace) -> int:
    import dataclasses

    from faultwatch.agents.bootcheck import bootcheck_now

    ship = None
    if not args.no_ship:
        ship = AgentConfig.from_env_defaults(
            bootstrap=args.bootstrap, job=args.job, node=args.node, cmd=("bootcheck",),
            topic_prefix=args.topic_prefix, attempt=args.attempt or 0,
            spool_dir=Path(args.spool_dir) / "bootcheck" if args.spool_dir else None,
            exit_flush_timeout_s=args.exit_flush_timeout_s)
        if args.spool_dir is None:
            ship = dataclasses.replace(ship, spool_dir=ship.spool_dir / "bootcheck")
    kw = bootcheck_kw(args)
    return bootcheck_now(kw["bootcheck_paths"], kw["bootcheck_min_mb_s"],
                         kw["bootcheck_expect_gpus"], kw["bootcheck_allreduce"],
                         kw["bootcheck_timeout_s"], args.nnodes, ship)


# ---- parser -------------------------------------------------------------------------------

SUBCOMMANDS = AGENT_SUBCOMMANDS  # (the light table in commands.py lists them for tree.py)

AGENT_EPILOG = f"""\
subcommands (instead of -- CMD):
  faultwatch agent tail --job J [--node N] PATH...   ship existing log files
  faultwatch agent bootcheck --job J [...]           run the boot checks now, ship the result

exit codes (never the command's own: that one is in the verdict line, --verdict-out
and the decision; docs/cli.md#exit-codes):
  0 the command succeeded;
  {EXIT_RESTART} restart here (a restart decision with --on-restart exit);
  {EXIT_BLACKLISTED} run me elsewhere: a blacklist decision named this node, or a boot check
      failed with --bootcheck-abort;
  {EXIT_FAILED} a fail decision: permanent;
  {EXIT_UNDECIDED} the command failed and no decision arrived within --decision-wait-s;
  {EXIT_NODES_TIMEOUT} --wait-for-nodes timed out;
  129/130/143 the agent itself got SIGHUP/SIGINT/SIGTERM; 1-9 faultwatch's own errors
      (8: --strict refused a launch whose timeouts do not nest).
"""


def _add_agent_common(p: argparse.ArgumentParser, job_required: bool) -> None:
    """Flags shared by `agent`, `agent tail` and `agent bootcheck`."""
    options.add_kafka(p)
    p.add_argument("--job", required=job_required, default=settings.JOB.get(),
                   help=f"job name (default ${settings.JOB})")
    p.add_argument("--node", default=None,
                   help=f"node name (default ${settings.NODE_NAME}, else $SLURMD_NODENAME "
                        "under Slurm, else the hostname)")
    p.add_argument("--heartbeat-s", type=float, default=options.default_of(AgentConfig,
                                                                          "heartbeat_s"),
                   help="heartbeat interval while the child is quiet")
    p.add_argument("--heartbeat-flowing-s", type=float,
                   default=options.default_of(AgentConfig, "heartbeat_flowing_s"),
                   help="heartbeat interval while the child prints (its lines prove it alive); "
                        "keep it + --heartbeat-s below half the processor's node_lost_s")
    p.add_argument("--run-id", default=None,
                   help="the job run's identity, shared by its agents and attempts (default "
                        f"${settings.RUN_ID}, else Slurm's job id, torchrun's --rdzv-id, "
                        f"${settings.K8S_UID}, else generated per agent)")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="a label of the run, sent in its run-start record (repeatable)")
    p.add_argument("--spool-dir", default=None,
                   help=f"spool root (default ${settings.SPOOL_DIR} or ~/.faultwatch/spool)")
    p.add_argument("--attempt", type=int, default=None,
                   help=f"attempt number of the job (default ${settings.ATTEMPT} or 0)")
    p.add_argument("--exit-flush-timeout-s", type=float,
                   default=options.default_of(AgentConfig, "exit_flush_timeout_s"),
                   help="how long to wait for acks at exit; the rest stays spooled")
    p.add_argument("--spool-cap-mb", type=int,
                   default=options.default_of(AgentConfig, "spool_cap_bytes") >> 20,
                   help="spool size cap (default %(default)s)")


def _add_linger(p: argparse.ArgumentParser) -> None:
    p.add_argument("--linger-ms", type=int, default=LINGER_MS, metavar="MS",
                   help=f"the longest a line waits to share a record with later lines "
                        f"(default {LINGER_MS}); after a quiet spell it waits "
                        f"{FIRST_LINGER_MS} ms, more while lines flow (1..{MAX_LINGER_MS})")


def _add_bootcheck_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootcheck-path", action="append", default=[], metavar="PATH",
                   help="a mount point whose write/read speed to check (repeatable)")
    p.add_argument("--bootcheck-min-mb-s", type=float, default=0.0,
                   help="a path slower than this (MB/s, write or read) fails its check")
    p.add_argument("--bootcheck-expect-gpus", type=int, default=None,
                   help="fail unless torch sees exactly this many GPUs")
    p.add_argument("--bootcheck-allreduce", action=argparse.BooleanOptionalAction,
                   default=True, help="run an all-reduce across the job's nodes (or 2 local "
                   "processes for a 1-node job) and measure its bandwidth")
    p.add_argument("--bootcheck-timeout-s", type=float,
                   default=options.default_of(AgentConfig, "bootcheck_timeout_s"),
                   help="timeout of each subprocess check (versions, all-reduce)")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "agent", help="run a command and ship its output, exit and heartbeats to Kafka",
        usage="faultwatch agent [options] -- CMD [ARGS...]\n"
              "       faultwatch agent {tail,bootcheck} ...",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=AGENT_EPILOG,
        description="Run CMD, tee its stdout/stderr unchanged, and ship lines, heartbeats and "
                    "its exit to <prefix>logs. Unacked records wait in a disk spool. "
                    "Under torchrun (--no-python) RANK/WORLD_SIZE are picked up from the env. "
                    "See docs/agent.md.")
    p.hint = "the training command goes after --: faultwatch agent --job J -- CMD [ARGS...]"
    _add_agent_common(p, job_required=False)
    p.add_argument("--rank", type=int, default=None, help="rank (default $RANK)")
    p.add_argument("--nnodes", type=int, default=None,
                   help="nodes of the job, sent in RunStart (default from torchrun's env)")
    p.add_argument("--term-grace-s", type=float,
                   default=options.default_of(AgentConfig, "term_grace_s"),
                   help="SIGTERM to SIGKILL escalation when stopping the child")
    p.add_argument("--max-line-bytes", type=int,
                   default=options.default_of(AgentConfig, "max_line_bytes"))
    _add_linger(p)
    p.add_argument("--node-key-file", type=Path, default=None,
                   help="this node's Ed25519 key (`faultwatch keys generate --node NODE`): "
                        "signs what the agent sends, so no other node can speak for this one "
                        f"(default ${settings.NODE_KEY_FILE}; never passed to the child)")
    p.add_argument("--follow-decisions", action=argparse.BooleanOptionalAction,
                   default=None,
                   help="act on <prefix>decisions for the job: restart the child on `restart`, "
                        f"exit {EXIT_BLACKLISTED} on `blacklist` naming this node, stop and exit "
                        f"{EXIT_FAILED} on `fail`; after a failure wait --decision-wait-s for "
                        "the decision; answer the probes of <prefix>control "
                        f"(default: ${settings.FOLLOW_DECISIONS} if set, else on in node mode "
                        "and off in rank mode, where torchrun or the scheduler restarts ranks)")
    p.add_argument("--decision-wait-s", type=float,
                   default=options.default_of(AgentConfig, "decision_wait_s"),
                   help="after the child failed, how long to wait for the job's decision "
                        f"(none: exit {EXIT_UNDECIDED})")
    p.add_argument("--decisions-out", metavar="FILE",
                   help="append the job's decisions this agent reads as JSON lines")
    options.add_verdict(p)
    p.add_argument("--sdk", action=argparse.BooleanOptionalAction, default=True,
                   help=f"open a Unix socket for the training SDK (${settings.SDK_SOCKET} in "
                        "the child's env) and ship its messages as notes")
    p.add_argument("--wait-for-nodes", type=int, metavar="N",
                   default=options.default_of(AgentConfig, "wait_for_nodes"),
                   help="hold the launch until N nodes of the job have an agent up")
    p.add_argument("--wait-for-nodes-timeout-s", type=float,
                   default=options.default_of(AgentConfig, "wait_for_nodes_timeout_s"),
                   help=f"give up waiting (exit {EXIT_NODES_TIMEOUT}) after this long")
    p.add_argument("--spares", type=int, default=None, metavar="K",
                   help="hot spares: the last K nodes of the allocation wait, checked, without "
                        "the command and replace a bad node inside the running job (the "
                        "node's place: --node-index/--nodes-total, else SLURM_NODEID of "
                        "SLURM_STEP_NUM_NODES, or JOB_COMPLETION_INDEX; default "
                        f"${settings.SPARES} or 0)")
    p.add_argument("--spare", action="store_true",
                   help="this agent is a hot spare whatever its place (a second srun step "
                        "or Job for the spares)")
    p.add_argument("--node-index", type=int, default=None, metavar="I",
                   help="this node's place in the allocation, 0-based (with --spares)")
    p.add_argument("--nodes-total", type=int, default=None, metavar="M",
                   help="how many nodes the allocation has, spares included (with --spares; "
                        f"default ${settings.NODES_TOTAL}, else Slurm's)")
    p.add_argument("--spare-note-s", type=float,
                   default=options.default_of(AgentConfig, "spare_note_s"),
                   help="how often a waiting spare tells the processor it is alive (keep it "
                        "below half the processor's node_lost_s)")
    p.add_argument("--bootcheck", action="store_true",
                   help="run the boot checks before every launch (the first, and each "
                        "relaunch after a failure); ship a bootcheck note")
    p.add_argument("--bootcheck-abort", action="store_true",
                   help=f"a failed boot check aborts the launch (exit {EXIT_BOOTCHECK_FAILED})")
    _add_bootcheck_flags(p)
    options.add_metrics(p)
    p.add_argument("--flush", action="store_true",
                   help="no command: deliver what an earlier agent left in the spool, exit")
    options.add_check(p)
    options.add_logging(p, "warning")
    p.set_defaults(func=cmd_agent)
    asub = options.subcommands(p, "agent_command", metavar="{tail,bootcheck}",
                               prog="faultwatch agent")

    t = asub.add_parser("tail", help="ship existing log files",
                        description="Ship existing log files (polling; offsets persisted; "
                                    "rotation and truncation handled).")
    _add_agent_common(t, job_required=True)
    t.add_argument("--state-file", default=None,
                   help="offsets (default <spool>/<job>/<node>/tail/state.json)")
    t.add_argument("--poll-s", type=float, default=0.5, help="polling interval")
    t.add_argument("--from-end", action="store_true",
                   help="files without saved offsets start at their end (default: start)")
    t.add_argument("--max-line-bytes", type=int,
                   default=options.default_of(AgentConfig, "max_line_bytes"))
    _add_linger(t)
    t.add_argument("paths", nargs="+", metavar="PATH")
    options.add_logging(t)
    t.set_defaults(func=cmd_agent_tail)

    b = asub.add_parser("bootcheck", help="run the boot checks now, ship the result",
                        description="Run the boot checks now; print them as JSON and ship a "
                                    "bootcheck note (unless --no-ship).")
    _add_agent_common(b, job_required=True)
    _add_bootcheck_flags(b)
    b.add_argument("--nnodes", type=int, default=None)
    b.add_argument("--no-ship", action="store_true", help="only print the result")
    b.set_defaults(func=cmd_agent_bootcheck)
