"""The light table of every top-level `faultwatch` command: name, one-line help, and the
module that registers its options and runs it (imported only when that command is given)."""

from __future__ import annotations

from typing import NamedTuple


class Command(NamedTuple):
    """One top-level command: `module` (under faultwatch.cli) has `register(sub)`."""

    name: str
    module: str
    help: str


COMMANDS: tuple[Command, ...] = (
    Command("run", "run", "embedded mode: supervise CMD in-process, no Kafka"),
    Command("agent", "agent", "run a command and ship its output, exit and heartbeats to Kafka"),
    Command("check", "check", "the job's timeout chain before it runs: do the timeouts nest?"),
    Command("process", "process", "cluster mode: run a processor worker (both stages; needs "
                                  "faultwatch[processor])"),
    Command("notify", "notify", "send decisions to webhooks (Slack, Feishu, DingTalk, JSON), "
                                "grouped like Alertmanager, or to Alertmanager as alerts"),
    Command("status", "status", "the jobs the processors know: run, attempt, ranks alive, "
                                "quietest ranks, stage and window, last decisions"),
    Command("describe", "describe", "one job in full: run, attempts, nodes, quiet ranks, "
                                    "window and why, holds, decisions, refusals"),
    Command("decisions", "read", "print decisions from the decisions topic"),
    Command("logs", "read", "print the shipped lines of a job, all nodes and ranks in time "
                            "order, with attempt separators and decisions"),
    Command("report", "report", "a job's incidents and goodput (or the fleet's): where the "
                                "wall time went, what each failure cost, lemon nodes"),
    Command("diagnose", "diagnose", "ask a running job's agents for every rank's stack and "
                                    "Flight Recorder dump; print who waits where (cluster "
                                    "mode; embedded mode does this before every hang)"),
    Command("rules", "rules", "check, test, try, push, roll back, show and diff rule files"),
    Command("kafka", "kafka", "run a local single-node Kafka broker without Docker"),
    Command("nodes", "nodes", "the fleet-wide node registry: list, quarantine, release"),
    Command("jobs", "jobs", "hold or mute one job (like scontrol hold, amtool silence): list, "
                            "hold, mute, release, unmute"),
    Command("actuate", "actuate", "make a scheduler act on decisions and the node registry"),
    Command("keys", "keys", "make and show Ed25519 keys (processor, operator, node) and trust "
                            "files"),
    Command("completion", "completion", "print a shell completion script (bash, zsh)"),
)
BY_NAME = {c.name: c for c in COMMANDS}
NEEDS_TREE = ("completion",)  # commands that describe the whole tree: every module registers
AGENT_SUBCOMMANDS = ("tail", "bootcheck")  # `agent X` that wraps no command (agent.SUBCOMMANDS)
