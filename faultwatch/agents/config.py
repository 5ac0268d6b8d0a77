"""The agent's configuration: flags, environment defaults (torchrun rank mode) and paths."""

from __future__ import annotations

import hashlib
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faultwatch import settings
from faultwatch.agents.exitcodes import (  # noqa: F401 - re-exported
    EXIT_ELSEWHERE,
    EXIT_FAILED,
    EXIT_NODES_TIMEOUT,
    EXIT_RESTART,
    EXIT_UNDECIDED,
)
from faultwatch.agents.identity import resolve_identity
from faultwatch.core.chain import AGENT_DEFAULTS
from faultwatch.core.names import name_problem
from faultwatch.errors import ConfigError
from faultwatch.wire.topics import DEFAULT_PREFIX, Topics

# how long a line may wait in the agent to share a record with later lines (agents/batcher.py)
LINGER_MS = 100  # the bound, while lines flow (--linger-ms)
FIRST_LINGER_MS = 20  # after a quiet spell (a bound below it is used instead)
MAX_LINGER_MS = 10_000

# Exit codes of the agent itself: agents/exitcodes.py (the contract; the child's own code is
# never passed through). The older names stay for callers.
EXIT_BLACKLISTED = EXIT_ELSEWHERE  # a blacklist decision named this node: reschedule elsewhere
EXIT_BOOTCHECK_FAILED = EXIT_ELSEWHERE  # --bootcheck-abort: a boot check failed, never ran
EXIT_FAILED_BY_DECISION = EXIT_FAILED  # a fail decision
ON_RESTART = ("relaunch", "exit")


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    v = env.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ConfigError(name, f"not an integer: {v!r}") from None


def rank_from_env(env: Mapping[str, str]) -> tuple[int | None, int | None]:
    """(rank, world_size) when run as torchrun's entrypoint (RANK, WORLD_SIZE set)."""
    return _env_int(env, "RANK"), _env_int(env, "WORLD_SIZE")


def default_spool_dir(env: Mapping[str, str]) -> Path:
    return settings.SPOOL_DIR.get(env) or Path.home() / ".faultwatch" / "spool"


_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_MAX_COMPONENT = 120  # bytes of one encoded path component (file systems allow 255)


def safe_name(s: str) -> str:
    """One path component for a job or node name: injective and never `.`/`..`/empty.

    Every character outside [A-Za-z0-9._-] is percent-encoded (UTF-8 bytes, `%` itself
    included), so `x y` and `x_y` differ; a name of dots only is fully encoded; a long
    result keeps a prefix plus `~` and a hash of the whole name (`~` appears nowhere else)."""
    if not s:
        return "%"
    if set(s) == {"."}:
        return "%2E" * len(s)
    out = "".join(c if c in _PLAIN else "".join(f"%{b:02X}" for b in c.encode("utf-8",
                                                                           "surrogatepass"))
                  for c in s)
    if len(out) > _MAX_COMPONENT:
        digest = hashlib.sha256(s.encode("utf-8", "surrogatepass")).hexdigest()[:20]
        out = out[:_MAX_COMPONENT - 21] + "~" + digest
    return out


def check_name(key: str, value: str) -> None:
    """A job or node name by the one rule (core/names.py: 1..MAX_NAME_CHARS characters, no
    control or line-break characters; they would reach terminals and logs); ConfigError
    otherwise."""
    problem = name_problem(value)
    if problem is not None:
        raise ConfigError(key, problem)


@dataclass(frozen=True, kw_only=True)
class AgentConfig:
    """Everything the agent needs; build it with from_env_defaults() to honour the env."""

    bootstrap: str
    job: str
    node: str
    cmd: tuple[str, ...]
    spool_dir: Path
    topic_prefix: str = DEFAULT_PREFIX
    attempt: int = 0
    heartbeat_s: float = AGENT_DEFAULTS["agent.heartbeat_s"]
    # while the child prints, its lines already prove the node alive: a heartbeat only this
    # often (see heartbeat_due); keep it + heartbeat_s below half the processor's node_lost_s
    heartbeat_flowing_s: float = AGENT_DEFAULTS["agent.heartbeat_flowing_s"]
    rank: int | None = None
    world_size: int | None = None
    nnodes: int | None = None
    local_ranks: tuple[int, ...] = ()
    exit_flush_timeout_s: float = AGENT_DEFAULTS["agent.exit_flush_timeout_s"]
    term_grace_s: float = AGENT_DEFAULTS["agent.term_grace_s"]
    max_line_bytes: int = 65536
    # the longest a line waits in the agent to share a record with later lines; the wait
    # starts at FIRST_LINGER_MS after a quiet spell and grows to this while lines flow
    # (agents/batcher.py): bursts go out in fewer, larger records
    linger_ms: int = LINGER_MS
    progress_interval_s: float = 1.0
    spool_cap_bytes: int = 256 << 20
    compression: str | None = None  # None: zstd if available, else gzip
    env: Mapping[str, str] | None = field(default=None, repr=False)  # child env (None: ours)
    follow_decisions: bool = False
    decision_wait_s: float = AGENT_DEFAULTS["agent.decision_wait_s"]
    decisions_ready_timeout_s: float = 10.0  # broker down at start: launch anyway after this
    sdk: bool = True  # open the SDK socket for the training process
    diagnose: bool = True  # answer `diagnose` decisions: rank stacks, Flight Recorder dumps
    # hold the launch until this many agents of the job are up
    wait_for_nodes: int = int(AGENT_DEFAULTS["agent.wait_for_nodes"])
    wait_for_nodes_timeout_s: float = AGENT_DEFAULTS["agent.wait_for_nodes_timeout_s"]
    bootcheck: bool = False
    bootcheck_paths: tuple[str, ...] = ()
    bootcheck_abort: bool = False
    bootcheck_allreduce: bool = True
    bootcheck_min_mb_s: float = 0.0
    bootcheck_expect_gpus: int | None = None
    bootcheck_timeout_s: float = 120.0
    spool_leaf: str | None = None  # overrides leaf (tail mode: "tail")
    # The run identity (agents/identity.py): stable across this agent's attempts.
    run_id: str = ""  # "" here: a generated one is filled in
    run_source: str = ""
    scheduler: dict[str, object] = field(default_factory=dict)
    labels: tuple[str, ...] = ()  # --label k=v, as given
    metrics_port: int | None = None  # serve Prometheus /metrics on this port
    node_key_file: Path | None = None  # the node's Ed25519 key (else $FAULTWATCH_NODE_KEY_FILE)
    metrics_address: str = "127.0.0.1"  # ... on this address (0.0.0.0: every interface)
    # write where /metrics listens here (file_sd JSON; {job}, {node}, {pid} filled in)
    metrics_address_file: str | None = None
    # The exit contract (agents/exitcodes.py): where the verdict and the decisions go, and
    # whether a restart decision relaunches the child here or exits EXIT_RESTART for the
    # scheduler, a shell loop or torchrun to relaunch the agent.
    verdict_out: Path | None = None
    decisions_out: Path | None = None
    on_restart: str = "relaunch"
    # Hot spares (agents/roles.py, agents/spare.py): this agent is a spare (`spare`), or the
    # last `spares` nodes of the allocation are; its place in it when the scheduler's
    # environment does not say; how often a waiting spare says it is alive
    spare: bool = False
    spares: int = 0
    node_index: int | None = None
    nodes_total: int | None = None
    spare_note_s: float = 5.0

    def __post_init__(self) -> None:
        if self.on_restart not in ON_RESTART:
            raise ConfigError("on_restart", f"must be one of {', '.join(ON_RESTART)}")
        check_name("job", self.job)
        if not isinstance(self.linger_ms, int) or isinstance(self.linger_ms, bool) \
                or not 1 <= self.linger_ms <= MAX_LINGER_MS:
            raise ConfigError("linger_ms", f"must be an integer from 1 to {MAX_LINGER_MS} "
                                           f"(milliseconds), got {self.linger_ms!r}")
        check_name("node", self.node)
        if not 0.2 <= self.spare_note_s <= 3600:
            raise ConfigError("spare_note_s", f"must be 0.2..3600 seconds, got "
                                              f"{self.spare_note_s!r}")
        if not self.run_id:  # built directly (not from the env): a generated identity
            ident = resolve_identity(None, self.labels, {}, (), lambda: uuid.uuid4().hex)
            object.__setattr__(self, "run_id", ident.run_id)
            object.__setattr__(self, "run_source", ident.run_source)
            object.__setattr__(self, "scheduler", ident.scheduler)

    @classmethod
    def from_env_defaults(cls, env: Mapping[str, str] | None = None, **kw: Any) -> AgentConfig:
        """Fill bootstrap, node, prefix, spool dir and rank fields from env where not given."""
        e = os.environ if env is None else env
        if kw.get("bootstrap") is None:
            kw["bootstrap"] = settings.BOOTSTRAP.get(e) or ""
        if not kw["bootstrap"]:
            raise ConfigError("bootstrap", f"no --bootstrap and {settings.BOOTSTRAP} is unset")
        if kw.get("topic_prefix") is None:
            kw["topic_prefix"] = settings.TOPIC_PREFIX.get(e) or DEFAULT_PREFIX
        if kw.get("spool_dir") is None:
            kw["spool_dir"] = default_spool_dir(e)
        rank, world = rank_from_env(e)
        if kw.get("rank") is None:
            kw["rank"] = rank
        if kw.get("world_size") is None:
            kw["world_size"] = world
        if kw.get("node") is None:
            # Rank mode: every rank's agent is its own instance of the job (its own exit and
            # heartbeats), so the default instance name carries the rank; the host is in the
            # run-start record. Node mode under Slurm: the node's name as slurmd knows it
            # (what actuate drains and a node key is made for), else the host name.
            host = socket.gethostname()
            kw["node"] = settings.NODE_NAME.get(e) or (
                (e.get("SLURMD_NODENAME") or host) if kw["rank"] is None
                else f"{host}-rank{kw['rank']}")
        local = _env_int(e, "LOCAL_RANK")
        if not kw.get("local_ranks") and local is not None:
            kw["local_ranks"] = (local,)
        lws = _env_int(e, "LOCAL_WORLD_SIZE")
        if kw.get("nnodes") is None and world and lws:
            kw["nnodes"] = max(1, world // lws)
        kw["spool_dir"] = Path(kw["spool_dir"])
        kw["cmd"] = tuple(kw.get("cmd") or ())
        kw["bootcheck_paths"] = tuple(kw.get("bootcheck_paths") or ())
        kw["labels"] = tuple(kw.get("labels") or ())
        ident = resolve_identity(kw.get("run_id"), kw["labels"], e, kw["cmd"],
                                 lambda: uuid.uuid4().hex, job=str(kw.get("job") or ""))
        kw.update(run_id=ident.run_id, run_source=ident.run_source, scheduler=ident.scheduler)
        return cls(**{k: v for k, v in kw.items() if v is not None or k in _NULLABLE})

    @property
    def topics(self) -> Topics:
        return Topics(self.topic_prefix)

    @property
    def topic(self) -> str:
        return self.topics.logs

    @property
    def decisions_topic(self) -> str:
        return self.topics.decisions

    @property
    def control_topic(self) -> str:
        return self.topics.control

    @property
    def leaf(self) -> str:
        """This agent's name below job/node: rankN in rank mode, else `agent`."""
        if self.spool_leaf:
            return self.spool_leaf
        return f"rank{self.rank}" if self.rank is not None else "agent"

    @property
    def spool_path(self) -> Path:
        """One spool per job, node and (in rank mode) rank: concurrent agents never share."""
        return self.spool_dir / safe_name(self.job) / safe_name(self.node) / self.leaf


_NULLABLE = {"rank", "world_size", "nnodes", "compression", "env", "bootcheck_expect_gpus",
             "spool_leaf", "verdict_out", "decisions_out", "node_index", "nodes_total"}
