"""`faultwatch check [flags] -- CMD`: the job's timeout chain before it runs, and the same check
at the start of `run` and `agent` (printed once; with --strict a broken link refuses the
launch, exit 9). The shell around core/chain_rules.py: it reads the environment, the
scheduler (scontrol, slurm.conf, the pod's environment), the policy's layers and, with
--bootstrap, the job's earlier runs; docs/timeouts.md."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from faultwatch import settings
from faultwatch.cli import options
from faultwatch.core.chain import AGENT_DEFAULTS, BROKEN, NOTE, OK, UNKNOWN, Chain, Faultwatch
from faultwatch.errors import EXIT_CHAIN, EXIT_OK, ChainError
from faultwatch.launch.model import DEFAULT, FLAG, Setting

SCONTROL_TIMEOUT_S = 5.0
SLURM_CONF = "/etc/slurm/slurm.conf"
# the agent's timers `check` takes, as flags of `faultwatch agent` (dest -> chain key)
AGENT_FLAGS = {"term_grace_s": "agent.term_grace_s",
               "exit_flush_timeout_s": "agent.exit_flush_timeout_s",
               "decision_wait_s": "agent.decision_wait_s", "heartbeat_s": "agent.heartbeat_s",
               "heartbeat_flowing_s": "agent.heartbeat_flowing_s",
               "wait_for_nodes": "agent.wait_for_nodes",
               "wait_for_nodes_timeout_s": "agent.wait_for_nodes_timeout_s"}


# ---- reading what the chain is made of ----------------------------------------------------

def _scontrol(*args: str) -> str | None:
    exe = shutil.which("scontrol")
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, *args], capture_output=True, text=True,
                           timeout=SCONTROL_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout if r.returncode == 0 else None


def scheduler_context(env: Mapping[str, str], *, ask: bool = True) -> Any:
    """The scheduler's context from the environment; under Slurm KillWait from `scontrol
    show config` (when `ask`), else from slurm.conf ($SLURM_CONF or /etc/slurm)."""
    from faultwatch.launch import scheduler

    kind = scheduler.detect(env)
    if kind == "kubernetes":
        return scheduler.kubernetes(env)
    if kind != "slurm":
        return scheduler.Scheduler()
    config = _scontrol("show", "config") if ask else None
    job = _scontrol("show", "job", env["SLURM_JOB_ID"]) if ask else None
    path = env.get("SLURM_CONF") or SLURM_CONF
    conf: str | None = None
    if config is None:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                conf = f.read(1 << 20)
        except OSError:
            conf = None
    return scheduler.slurm(env, config, job, conf, path)


def faultwatch_side(rules: Sequence[str], overrides: Mapping[str, Any],
                    agent: Mapping[str, Setting]) -> Faultwatch:
    """faultwatch's effective policy (the built-in rules, the files, the flags: the one
    layering of rules/layers.py) with each key's origin, and the agent's timers."""
    from faultwatch import __version__
    from faultwatch.rules import layers

    rif = layers.load(list(rules), flags=dict(overrides))
    return Faultwatch(rif.policy, rif.policy_origins(), dict(agent), __version__)


def agent_settings(values: Mapping[str, Any], given: Mapping[str, bool]) -> dict[str, Setting]:
    """The agent's timers as settings: a flag when given, else the agent's default."""
    from faultwatch import __version__

    out: dict[str, Setting] = {}
    for dest, key in AGENT_FLAGS.items():
        v = values.get(dest)
        if v is None:
            continue
        flag = "--" + dest.replace("_", "-")
        out[key] = (Setting(key, v, FLAG, flag) if given.get(dest) else
                    Setting(key, v, DEFAULT, f"faultwatch {__version__} agent {flag}"))
    return out


def torch_version(cmd: Sequence[str]) -> str | None:
    """The version of the torch the command will use (its torch/version.py, read, never
    imported; agents/torchrun_env.run_py finds it), or None."""
    import re

    from faultwatch.agents.torchrun_env import run_py

    path = run_py(cmd)
    if path is None:
        return None
    try:
        text = (path.parent.parent / "version.py").read_text(errors="replace")[:4096]
    except OSError:
        return None
    m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return m.group(1) if m else None


def build_chain(cmd: Sequence[str], fw: Faultwatch, env: Mapping[str, str], *,
                ask_scheduler: bool = True, learned: Any = None) -> Chain:
    from faultwatch.core.chain import Inputs
    from faultwatch.core.chain_rules import build
    from faultwatch.core.learned import Learned
    from faultwatch.launch import parse

    return build(Inputs(parse(cmd, env), fw, scheduler_context(env, ask=ask_scheduler),
                        learned if learned is not None else Learned()))


# ---- printing -----------------------------------------------------------------------------

def _link_lines(link: Any, indent: str = "  ") -> list[str]:
    mark = {BROKEN: "BROKEN", OK: "ok", UNKNOWN: "unknown", NOTE: "note"}[link.status]
    out = [f"{indent}{mark:<8}{link.id}: {link.says}"]
    if link.consequence and link.status in (BROKEN, NOTE):
        out.append(f"{indent}        will happen: {link.consequence}")
    if link.fix and link.status in (BROKEN, NOTE):
        out.append(f"{indent}        fix: {link.fix}")
    return out


def torch_note(version: str | None) -> str:
    """Whether the torch defaults shown are the job's torch's."""
    from faultwatch.launch.defaults import TORCH

    read = TORCH.split()[1]
    if version is None:
        return f"the command's torch: not found (torch defaults: {TORCH}'s)"
    if version.split("+")[0] == read:
        return f"the command's torch: {version} (the torch defaults were read from it)"
    return (f"the command's torch: {version}; the torch defaults shown are {TORCH}'s, "
            f"not verified for {version}")


def render(chain: Chain, torch: str | None = None) -> str:
    """The chain for a person: the launch, the timers in the order they fire with their
    sources, each link, the problems reading the launch, the result."""
    from faultwatch.core.chain import fmt_s

    la, sch = chain.inputs.launch, chain.inputs.scheduler
    what = la.launcher + (f" via {' + '.join(la.wrappers)}" if la.wrappers else "")
    lines = [f"timeout chain of `{' '.join(la.argv)[:200]}` ({what}; scheduler: "
             f"{sch.identity or sch.kind})"]
    if la.torchrun is not None:
        lines.append(torch_note(torch))
    lines.append("")
    rows = [(t.phase, t.party, t.name, fmt_s(t.setting.seconds) if not isinstance(
        t.setting.value, bool) else str(t.setting.value), t.setting.source())
        for t in chain.timers]
    head = ("phase", "party", "timer", "value", "source")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    for r in [head, *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True))
                     + "  " + r[4])
    lines += ["", "links:"]
    for link in sorted(chain.links, key=lambda lk: (lk.status != BROKEN, lk.status != UNKNOWN)):
        lines += _link_lines(link)
    problems = (*la.problems, *sch.problems)
    if problems:
        lines += ["", "could not read:"] + [f"  {p}" for p in problems]
    n = len(chain.broken)
    lines += ["", f"result: {n} broken link{'s' if n != 1 else ''}"
                  + (f" (exit {EXIT_CHAIN} with --strict)" if n else ": the timeouts nest")]
    return "\n".join(lines)


def preflight(cmd: Sequence[str], fw: Faultwatch, *, strict: bool, component: str,
              policy_note: str = "") -> None:
    """The check at the start of `run` and `agent`: the broken links once on stderr, an
    event line; with `strict`, a broken link raises ChainError (the launch is refused).
    Under Slurm only node 0 asks scontrol (others read slurm.conf): one RPC per job."""
    from faultwatch.eventlog import log_event

    env = dict(os.environ)
    ask = env.get("SLURM_NODEID", "0") in ("", "0")
    chain = build_chain(cmd, fw, env, ask_scheduler=ask)
    unknown = sum(1 for lk in chain.links if lk.status == UNKNOWN)
    log_event("timeout_chain", broken=len(chain.broken), unknown=unknown,
              links=len(chain.links), ids=",".join(lk.id for lk in chain.broken) or None)
    if not chain.broken:
        return
    n = len(chain.broken)
    lines = [f"faultwatch {component}: timeout chain: {n} broken link{'s' if n != 1 else ''}"
             f" (`faultwatch check ... -- CMD` shows the whole chain{policy_note})"]
    for link in chain.broken:
        lines += _link_lines(link)
    print("\n".join(lines), file=sys.stderr, flush=True)
    if strict:
        raise ChainError(f"--strict: {n} broken link(s) in the timeout chain "
                         f"({', '.join(lk.id for lk in chain.broken)}); not launching")


# ---- the command --------------------------------------------------------------------------

def cmd_check(args: argparse.Namespace) -> int:
    import orjson

    from faultwatch.core.learned import Learned

    cmd = options.wrapped_command(args)
    values = {d: getattr(args, d) for d in AGENT_FLAGS}
    given = {d: v is not None for d, v in values.items()}
    values = {d: (v if v is not None else AGENT_DEFAULTS[AGENT_FLAGS[d]])
              for d, v in values.items()}
    fw = faultwatch_side(args.rules or (), options.policy_overrides(args),
                         agent_settings(values, given))
    learned = Learned()
    if args.bootstrap:
        from faultwatch.readers.history import read_learned

        if not args.job:
            learned = Learned(why="--bootstrap without --job: whose runs?")
        else:
            t = options.topics(args)
            learned = read_learned(args.bootstrap, t.decisions, t.status, args.job)
    chain = build_chain(cmd, fw, dict(os.environ), learned=learned)
    torch = torch_version(cmd) if chain.inputs.launch.torchrun is not None else None
    code = EXIT_CHAIN if args.strict and chain.broken else EXIT_OK
    if args.json:
        print(orjson.dumps({**chain.to_dict(), "torch_version": torch, "exit_code": code},
                           option=orjson.OPT_INDENT_2).decode())
    else:
        print(render(chain, torch))
    return code


def register(sub: Any) -> None:
    p = sub.add_parser(
        "check", help="the job's timeout chain before it runs: do the timeouts nest?",
        usage="faultwatch check [options] -- CMD [ARGS...]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Read the command line, the environment, the scheduler (Slurm KillWait, "
                    "the pod's grace), faultwatch's policy and agent timers and, with "
                    "--bootstrap and --job, the job's earlier runs; print every timeout in "
                    "the order it fires with where its value came from, and each link that "
                    "does not nest with what will happen and the fix. Nothing is run. "
                    "See docs/timeouts.md.",
        epilog="example:\n  faultwatch check --bootstrap kafka:9092 --job llm -- \\\n"
               "      torchrun --nnodes 8 --rdzv-backend c10d --rdzv-endpoint h0:29400 "
               "train.py\n\nexit codes: 0 (also with broken links unless --strict), "
               f"{EXIT_CHAIN} a broken link with --strict, 2 bad flags, 3 bad rules, "
               "5 Kafka unreachable (docs/cli.md#exit-codes)")
    p.hint = "the training command goes after --: faultwatch check [options] -- CMD [ARGS...]"
    options.add_kafka(p)
    p.add_argument("--job", default=settings.JOB.get(),
                   help="the job whose earlier runs to read (with --bootstrap; default "
                        f"${settings.JOB})")
    options.add_rules(p)
    options.add_policy(p)
    g = p.add_argument_group("the agent's timers (as `faultwatch agent` takes them)")
    for dest, typ, what in (
            ("term_grace_s", float, "SIGTERM -> SIGKILL of the command"),
            ("exit_flush_timeout_s", float, "wait for acks at exit"),
            ("decision_wait_s", float, "wait for the decision after a failure"),
            ("heartbeat_s", float, "heartbeat interval while the command is quiet"),
            ("heartbeat_flowing_s", float, "heartbeat interval while it prints"),
            ("wait_for_nodes", int, "hold the launch until N nodes have an agent up"),
            ("wait_for_nodes_timeout_s", float, "give up waiting after this long")):
        g.add_argument("--" + dest.replace("_", "-"), dest=dest, type=typ, default=None,
                       help=f"{what} (default {AGENT_DEFAULTS[AGENT_FLAGS[dest]]:g})")
    options.add_json(p, "the chain as one JSON object (timers, links, sources)")
    p.add_argument("--strict", action="store_true",
                   help=f"exit {EXIT_CHAIN} when a link is broken (for CI); without it the "
                        "chain is printed and the exit code is 0")
    p.set_defaults(func=cmd_check)
