"""Every FAULTWATCH_* environment variable, declared once: its name, type, default, who reads
it, whether the child may see it; one strict reader per type (docs/cli.md's environment table
is generated from VARS, and no other module spells a FAULTWATCH_ name: tests/unit/test_settings.py).

A small typed reader rather than pydantic-settings: the SDK imports this module inside every
training rank, and the node side installs into users' training images with few dependencies
(pydantic-core is a compiled wheel that training stacks pin in both major versions)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from faultwatch.errors import ConfigError

T = TypeVar("T")
PREFIX = "FAULTWATCH_"
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


def parse_bool(name: str, value: Any) -> bool:
    """The one boolean grammar: 1/true/yes/on or 0/false/no/off (any case), else ConfigError."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE:
        return True
    if text in FALSE:
        return False
    raise ConfigError(name, f"{value!r} is not true or false (one of {'/'.join(TRUE)} or "
                            f"{'/'.join(FALSE)})")


def _int(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(name, f"not an integer: {text!r}") from None


def _float(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(name, f"{text!r} is not a number") from None


_PARSE: dict[type, Any] = {str: lambda _n, t: t, int: _int, float: _float, bool: parse_bool,
                           Path: lambda _n, t: Path(t).expanduser()}


@dataclass(frozen=True)
class Var(Generic[T]):
    """One variable. `sides`: who reads it (node, processor, operator, rank: the training
    process); `to_child`: the agent sets it for the child; `secret`: the agent strips it from
    the child's environment. Unset and empty are the same: the default."""

    name: str
    type: type[T]
    default: T | None
    doc: str
    sides: tuple[str, ...]
    to_child: bool = False
    secret: bool = False
    lo: float | None = None  # the accepted range of a number, where it has one
    hi: float | None = None
    positive: bool = False  # a number that must be finite and above 0

    def raw(self, env: Mapping[str, str] | None = None) -> str | None:
        """The variable's text, stripped; None when unset or empty."""
        text = (os.environ if env is None else env).get(self.name, "").strip()
        return text or None

    def get(self, env: Mapping[str, str] | None = None) -> T | None:
        """The typed value (ConfigError naming the variable when it does not parse or is out
        of range), else the default."""
        text = self.raw(env)
        if text is None:
            return self.default
        value: T = _PARSE[self.type](self.name, text)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(self.name, f"must be a finite number, not {text!r}")
        if isinstance(value, int | float) and not isinstance(value, bool):
            if self.positive and not (math.isfinite(value) and value > 0):
                raise ConfigError(self.name, f"must be a positive number, not {text!r}")
            if (self.lo is not None and value < self.lo) \
                    or (self.hi is not None and value > self.hi):
                lo = "" if self.lo is None else f"{self.lo:g}"
                hi = "" if self.hi is None else f"{self.hi:g}"
                raise ConfigError(self.name, f"{value:g} is outside {lo} .. {hi}")
        return value

    def value(self, env: Mapping[str, str] | None = None) -> T:
        """get() of a variable declared with a default (never None)."""
        got = self.get(env)
        assert got is not None, f"{self.name} has no default"
        return got

    @property
    def fallback(self) -> T:
        """The declared default of a variable that has one."""
        assert self.default is not None, f"{self.name} has no default"
        return self.default

    def is_set(self, env: Mapping[str, str] | None = None) -> bool:
        return self.raw(env) is not None

    def __str__(self) -> str:
        return self.name


NODE, PROCESSOR, OPERATOR, RANK = "node", "processor", "operator", "rank"
ALL = (NODE, PROCESSOR, OPERATOR)
_vars: list[Var[Any]] = []


def _v(name: str, typ: type[T], default: T | None, doc: str, sides: tuple[str, ...] = ALL,
       **kw: Any) -> Var[T]:
    var = Var(PREFIX + name, typ, default, doc, sides, **kw)
    _vars.append(var)
    return var


# ---- Kafka: where, under which names, how securely (cli/options, kafka/settings) ----------
BOOTSTRAP = _v("BOOTSTRAP", str, None, "Kafka bootstrap HOST:PORT (`--bootstrap`)")
TOPIC_PREFIX = _v("TOPIC_PREFIX", str, None,
                  "topic name prefix (`--topic-prefix`; default `faultwatch.`)")
KAFKA_CONFIG = _v("KAFKA_CONFIG", Path, None, "YAML file of Kafka security settings")
# FAULTWATCH_KAFKA_<KEY>: one per Kafka security setting (flags over these over the file)
KAFKA: dict[str, Var[str]] = {key: _v(f"KAFKA_{key.upper()}", str, None, doc) for key, doc in {
    "security_protocol": "PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL",
    "sasl_mechanism": "PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512",
    "username": "SASL user name",
    "password": "SASL password (prefer password_file or the environment)",
    "password_file": "file holding the SASL password (one line)",
    "ca_file": "PEM file of the CA certificates that sign the brokers' certificates",
    "cert_file": "PEM client certificate (mutual TLS)",
    "key_file": "PEM private key of the client certificate",
    "check_hostname": "verify that the broker certificate names the host (true/false)",
}.items()}
KAFKA_CACHE = _v("KAFKA_CACHE", Path, None, "where `faultwatch kafka up` keeps the broker jars "
                 "(default ~/.cache/faultwatch/kafka-<version>)", (OPERATOR,))

# ---- faultwatch's own event lines (eventlog, cli/options) ---------------------------------
LOG_FORMAT = _v("LOG_FORMAT", str, None, "text or json (`--log-format`)")
LOG_LEVEL = _v("LOG_LEVEL", str, None, "debug, info, warning or error (`-q`, `-v` override)")

# ---- keys and the replay rule (trust/, wire/signing) --------------------------------------
TRUST_FILE = _v("TRUST_FILE", Path, None, "public keys this process accepts: unsigned or "
                "wrongly signed records are refused")
SIGNING_KEY_FILE = _v("SIGNING_KEY_FILE", Path, None, "the processor's or an operator's "
                      "Ed25519 private key (`--signing-key-file`)", (PROCESSOR, OPERATOR),
                      secret=True)
NODE_KEY_FILE = _v("NODE_KEY_FILE", Path, None, "the node's Ed25519 key "
                   "(`agent --node-key-file`)", (NODE,), secret=True)
DECISION_KEY = _v("DECISION_KEY", str, None, "legacy HMAC keys `<key-id>:<secret>[,...]`",
                  secret=True)
DECISION_KEY_FILE = _v("DECISION_KEY_FILE", Path, None, "legacy HMAC key file, lines "
                       "`<key-id> <secret>` (the first signs)", secret=True)
MAX_DECISION_AGE_S = _v("MAX_DECISION_AGE_S", float, 600.0, "older decisions are refused "
                        "(`--max-decision-age-s`; 1 s .. 7 days)", (NODE, OPERATOR),
                        lo=1.0, hi=7 * 86400.0)

# ---- the agent and `run` (agents/, cli/agent, cli/run) ------------------------------------
JOB = _v("JOB", str, None, "job name (`--job`); the agent sets it for the child", (NODE,),
         to_child=True)
NODE_NAME = _v("NODE", str, None, "node name (`--node`, default the hostname); the agent sets "
               "it for the child", (NODE,), to_child=True)
ATTEMPT = _v("ATTEMPT", int, 0, "attempt number (`--attempt`; a relauncher's count); the "
             "agent sets it for the child", (NODE,), to_child=True, lo=0, hi=10_000)
RUN_ID = _v("RUN_ID", str, None, "the run id (`--run-id`)", (NODE,))
SPOOL_DIR = _v("SPOOL_DIR", Path, None, "spool root (`--spool-dir`, default "
               "~/.faultwatch/spool)", (NODE,))
FOLLOW_DECISIONS = _v("FOLLOW_DECISIONS", bool, None, "act on decisions (default on in node "
                      "mode, off in rank mode)", (NODE,))
NODE_RANK = _v("NODE_RANK", int, None, "this node's rank for the boot checks' all-reduce "
               "(else NODE_RANK, GROUP_RANK, SLURM_NODEID)", (NODE,))
TORCHRUN_RANKS = _v("TORCHRUN_RANKS", bool, True, "false: leave torchrun's per-rank output "
                    "alone (no rank prefixes set)", (NODE,))
SWITCH_INTERVAL_S = _v("SWITCH_INTERVAL_S", float, 0.0005, "the agent's Python switch "
                       "interval (seconds)", (NODE,), lo=1e-6, hi=1.0)
K8S_NAMESPACE = _v("K8S_NAMESPACE", str, None, "the pod's namespace (downward API)", (NODE,))
K8S_POD = _v("K8S_POD", str, None, "the pod's name (downward API)", (NODE,))
K8S_NODE = _v("K8S_NODE", str, None, "the Kubernetes node's name (downward API)", (NODE,))
K8S_UID = _v("K8S_UID", str, None, "a Job/pod-set uid or label: the run id (downward API)",
             (NODE,))
K8S_TERMINATION_GRACE_S = _v("K8S_TERMINATION_GRACE_S", int, None, "the pod's "
                             "terminationGracePeriodSeconds (`faultwatch check`)", (NODE,))
SPARES = _v("SPARES", int, 0, "hot spares: the last K nodes of the allocation wait (`agent "
            "--spares`)", (NODE,), lo=0)
NODES_TOTAL = _v("NODES_TOTAL", int, None, "how many nodes the allocation has, spares "
                 "included (`agent --nodes-total`)", (NODE,), lo=1)
LOCK_DIR = _v("LOCK_DIR", Path, None, "where a hot spare's node lock lives (default the "
              "temporary directory)", (NODE,))
SDK_SOCKET = _v("SDK_SOCKET", str, None, "the agent's Unix socket for the training SDK, set "
                "by the agent", (RANK,), to_child=True)
DIAG_DIR = _v("DIAG_DIR", Path, None, "where the ranks write Flight Recorder dumps on "
              "request, set by the agent", (RANK,), to_child=True)
NO_NATIVE = _v("NO_NATIVE", bool, False, "true: the matcher reads rank prefixes in pure "
               "Python (no `_batchscan`)", (NODE, PROCESSOR))

RULES_CACHE = _v("RULES_CACHE", str, None, "where compiled rule databases are cached (default "
                 "$XDG_CACHE_HOME/faultwatch/rules); set but empty, 0, off or no: no cache",
                 (NODE, PROCESSOR))

# ---- the processor (streams/) -------------------------------------------------------------
MAX_JOBS = _v("MAX_JOBS", int, 20_000, "active jobs per worker; new jobs beyond are refused",
              (PROCESSOR,), lo=1, hi=10**9)
FINISHED_TTL_S = _v("FINISHED_TTL_S", float, 86_400.0, "a decided or done job unchanged this "
                    "long leaves the worker's table (seconds, positive)", (PROCESSOR,),
                    positive=True)
SESSION_TIMEOUT_S = _v("SESSION_TIMEOUT_S", float, 10.0, "the workers' Kafka session "
                       "timeout (seconds)", (PROCESSOR,), positive=True)
NODE_LINES_PER_S = _v("NODE_LINES_PER_S", float, 20_000.0, "lines per second each node may "
                      "have matched; past it counted and announced, not matched (0: no "
                      "budget)", (PROCESSOR,), lo=0.0)
NODE_NEW_JOBS_PER_MIN = _v("NODE_NEW_JOBS_PER_MIN", float, 60.0, "new jobs a minute each node "
                           "may start; past it refused (0: no quota)", (PROCESSOR,), lo=0.0)
NODE_RUN_STARTS_PER_MIN = _v("NODE_RUN_STARTS_PER_MIN", float, 120.0, "run-starts a minute "
                             "each node may announce; past it refused (0: no quota)",
                             (PROCESSOR,), lo=0.0)
INCIDENTS_RETENTION_S = _v("INCIDENTS_RETENTION_S", float, 30 * 86_400.0, "the incidents and "
                           "acted topics drop what is older (seconds, positive; applied when "
                           "the processor creates them)", (PROCESSOR,), positive=True)
METRICS_LOG_S = _v("METRICS_LOG_S", float, 300.0, "one processor_metrics event line this "
                   "often (seconds, positive; rates and lags are on /metrics)", (PROCESSOR,),
                   positive=True)
PROCESSOR_DIR = _v("PROCESSOR_DIR", Path, None, "where Faust keeps its per-app metadata "
                   "(default ~/.cache/faultwatch/processor)", (PROCESSOR,))
START_ATTEMPT = _v("START_ATTEMPT", int, 0, "internal: a worker's start attempt after a "
                   "broker loss (set by the worker for itself)", (PROCESSOR,))

# ---- notify (cli/notify) ------------------------------------------------------------------
WEBHOOKS = _v("WEBHOOKS", str, None, "webhooks, whitespace-separated (`--webhook`)",
              (OPERATOR,))
ALERTMANAGERS = _v("ALERTMANAGERS", str, None, "Alertmanager URLs, whitespace-separated "
                   "(`--alertmanager`)", (OPERATOR,))
WEBHOOK_SECRET = _v("WEBHOOK_SECRET", str, None, "the secret signing notify's posts",
                    (OPERATOR,))

VARS: tuple[Var[Any], ...] = tuple(_vars)
BY_NAME = {v.name: v for v in VARS}
# What the agent's child never inherits: where the keys are and the legacy HMAC secrets.
CHILD_STRIPPED = tuple(v.name for v in VARS if v.secret)


def var(name: str) -> Var[Any]:
    """The declaration of a FAULTWATCH_ name (KeyError for an unknown one)."""
    return BY_NAME[name]


def child_env(env: Mapping[str, str], **given: str) -> dict[str, str]:
    """The child's environment: `env` without the secret variables, plus the variables the
    agent sets for it (`given`, by Var attribute name, e.g. JOB=...)."""
    out = {k: v for k, v in env.items() if k not in CHILD_STRIPPED}
    for attr, value in given.items():
        declared = globals()[attr]
        assert isinstance(declared, Var) and declared.to_child, attr
        out[declared.name] = value
    return out


def markdown() -> str:
    """The environment table of docs/cli.md, derived from VARS (a test keeps them equal)."""
    lines = ["| variable | type | default | read by | what |", "| --- | --- | --- | --- | --- |"]
    for v in VARS:
        default = "—" if v.default is None else f"`{v.default}`"
        extra = ("; never passed to the child" if v.name in CHILD_STRIPPED
                 else "; set for the child" if v.to_child else "")
        lines.append(f"| `{v.name}` | {v.type.__name__.lower()} | {default} | "
                     f"{', '.join(v.sides)} | {v.doc}{extra} |")
    return "\n".join(lines)
