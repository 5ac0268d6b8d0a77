"""torchrun's command line as torch 2.15.0's torch/distributed/run.py reads it (pure).

Each option is read like torchrun's argparse does: `--opt VALUE` or `--opt=VALUE`, dashes or
underscores, a unique prefix (argparse's abbreviations), `-m`/`-r`/`-t`; the first
positional argument is the training script and everything after it is the script's. An
option not given falls back to `PET_<DEST>` in the environment (argparse_util.env), then to
torchrun's default. Values torchrun would refuse, or that a shell has not expanded
(`--nnodes=$N`), are unknown, with a problem saying why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from faultwatch.launch.defaults import default
from faultwatch.launch.model import ENV, FLAG, Setting, Torchrun, unknown

# dest -> (option names, takes a value, read from PET_<DEST>)
_OPTIONS: dict[str, tuple[tuple[str, ...], bool, bool]] = {
    "nnodes": (("--nnodes",), True, True),
    "nproc_per_node": (("--nproc-per-node", "--nproc_per_node"), True, True),
    "rdzv_backend": (("--rdzv-backend", "--rdzv_backend"), True, True),
    "rdzv_endpoint": (("--rdzv-endpoint", "--rdzv_endpoint"), True, True),
    "rdzv_id": (("--rdzv-id", "--rdzv_id"), True, True),
    "rdzv_conf": (("--rdzv-conf", "--rdzv_conf"), True, True),
    "standalone": (("--standalone",), False, True),
    "max_restarts": (("--max-restarts", "--max_restarts"), True, True),
    "monitor_interval": (("--monitor-interval", "--monitor_interval"), True, True),
    "start_method": (("--start-method", "--start_method"), True, True),
    "event_log_handler": (("--event-log-handler", "--event_log_handler"), True, True),
    "role": (("--role",), True, True),
    "module": (("-m", "--module"), False, True),
    "no_python": (("--no-python", "--no_python"), False, True),
    "run_path": (("--run-path", "--run_path"), False, True),
    "log_dir": (("--log-dir", "--log_dir"), True, True),
    "redirects": (("-r", "--redirects"), True, True),
    "tee": (("-t", "--tee"), True, True),
    "log_line_prefix_template": (("--log-line-prefix-template",
                                  "--log_line_prefix_template"), True, True),
    "local_ranks_filter": (("--local-ranks-filter", "--local_ranks_filter"), True, True),
    "duplicate_stdout_filters": (("--duplicate-stdout-filters",
                                  "--duplicate_stdout_filters"), True, True),
    "duplicate_stderr_filters": (("--duplicate-stderr-filters",
                                  "--duplicate_stderr_filters"), True, True),
    "node_rank": (("--node-rank", "--node_rank"), True, True),
    "master_addr": (("--master-addr", "--master_addr"), True, True),
    "master_port": (("--master-port", "--master_port"), True, True),
    "local_addr": (("--local-addr", "--local_addr"), True, True),
    "logs_specs": (("--logs-specs", "--logs_specs"), True, False),
    "numa_binding": (("--numa-binding", "--numa_binding"), True, False),
    "signals_to_handle": (("--signals-to-handle", "--signals_to_handle"), True, True),
    "shutdown_timeout": (("--shutdown-timeout", "--shutdown_timeout"), True, True),
    "virtual_local_rank": (("--virtual-local-rank", "--virtual_local_rank"), False, True),
    "print_completion": (("--print-completion", "--print_completion"), True, False),
    # torch.distributed.launch (deprecated) adds this one
    "use_env": (("--use-env", "--use_env"), False, False),
}
_BY_NAME = {name: dest for dest, (names, _, _) in _OPTIONS.items() for name in names}
_LONG = sorted(n for n in _BY_NAME if n.startswith("--"))
DYNAMIC = ("c10d", "etcd-v2")  # the dynamic rendezvous (join_timeout ...)


@dataclass
class _Raw:
    """Options as given: dest -> (value, Setting origin), script, problems."""

    given: dict[str, tuple[str | bool, str, str]] = field(default_factory=dict)
    script: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _resolve(name: str) -> str | None:
    """The dest of an option name, also of an unambiguous prefix (argparse allow_abbrev)."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    hits = {_BY_NAME[n] for n in _LONG if n.startswith(name)} if name.startswith("--") else set()
    return hits.pop() if len(hits) == 1 else None


def _scan(args: Sequence[str]) -> _Raw:
    raw = _Raw()
    i = 0
    while i < len(args):
        tok = args[i]
        if tok == "--":  # argparse: the end of the options
            raw.script = list(args[i + 1:])
            return raw
        if not tok.startswith("-") or tok == "-":
            raw.script = list(args[i:])
            return raw
        name, eq, val = tok.partition("=") if tok.startswith("--") else (tok[:2], "", tok[2:])
        dest = _resolve(name)
        if dest is None:
            raw.problems.append(f"unknown torchrun option {name}")
            i += 1
            continue
        takes = _OPTIONS[dest][1]
        if not takes:
            raw.given[dest] = (True, FLAG, name)
        elif eq or val:
            raw.given[dest] = (val, FLAG, name)
        elif i + 1 < len(args):
            raw.given[dest] = (args[i + 1], FLAG, name)
            i += 1
        else:
            raw.problems.append(f"torchrun option {name} has no value")
        i += 1
    raw.problems.append("no training script after torchrun's options")
    return raw


def _value(raw: _Raw, env: Mapping[str, str], dest: str) -> tuple[str | bool, str, str] | None:
    """(value, origin, where) of an option: the flag, else PET_<DEST>, else None."""
    if dest in raw.given:
        return raw.given[dest]
    names, takes, from_env = _OPTIONS[dest]
    var = f"PET_{dest.upper()}"
    if from_env and var in env:
        if takes:
            return env[var], ENV, var
        try:  # check_env: bool(int(value))
            return bool(int(env[var])), ENV, var
        except ValueError:
            raw.problems.append(f"{var}={env[var]!r} is not an integer (torchrun would fail)")
    return None


def _number(raw: _Raw, key: str, text: str, origin: str, where: str, integer: bool
            ) -> Setting:
    try:
        value: float = int(text) if integer else float(text)
    except ValueError:
        raw.problems.append(f"{where}: {text!r} is not a number")
        return unknown(key, f"{where}={text!r} is not a number (unexpanded?)")
    return Setting(key, value, origin, where)


def _rdzv_conf(raw: _Raw, env: Mapping[str, str]) -> tuple[dict[str, str], str, str]:
    """The --rdzv-conf pairs as torch's _parse_rendezvous_config reads them."""
    got = _value(raw, env, "rdzv_conf")
    if got is None:
        return {}, "", ""
    text, origin, where = str(got[0]), got[1], got[2]
    out: dict[str, str] = {}
    for kv in text.strip().split(",") if text.strip() else ():
        key, _, value = kv.partition("=")
        if not key.strip() or not value.strip():
            raw.problems.append(f"{where} {text!r}: not <key>=<value>,... (torchrun would fail)")
            return {}, origin, where
        out[key.strip()] = value.strip()
    return out, origin, where


def parse_torchrun(args: Sequence[str], env: Mapping[str, str]
                   ) -> tuple[Torchrun, tuple[str, ...], dict[str, Setting], tuple[str, ...]]:
    """(torchrun's options, the training script and its arguments, the timeout settings by
    key, problems) of torchrun's arguments (what follows `torchrun`)."""
    raw = _scan(args)
    s: dict[str, Setting] = {}
    origin: dict[str, Setting] = {}

    def text(dest: str) -> tuple[str, str, str] | None:
        got = _value(raw, env, dest)
        return None if got is None else (str(got[0]), got[1], got[2])

    got = text("nnodes")
    if got is not None:
        lo, sep, hi = got[0].partition(":")
        a = _number(raw, "torchrun.nnodes_min", lo, got[1], got[2], True)
        b = _number(raw, "torchrun.nnodes_max", hi if sep else lo, got[1], got[2], True)
        nmin = int(a.value) if a.known and a.value is not None else None
        nmax = int(b.value) if b.known and b.value is not None else None
        origin["nnodes"] = b
    else:
        nmin = nmax = 1
    standalone = bool((_value(raw, env, "standalone") or (False,))[0])
    backend = text("rdzv_backend")
    if standalone:
        name, bsetting = "c10d", Setting("rdzv.backend", "c10d", FLAG, "--standalone")
    elif backend is not None:
        name, bsetting = backend[0], Setting("rdzv.backend", backend[0], backend[1], backend[2])
    else:
        name, bsetting = "static", default("torchrun.rdzv_backend")
    s["rdzv.backend"] = bsetting
    conf, corigin, cwhere = _rdzv_conf(raw, env)

    def rdzv(key: str, conf_key: str) -> Setting:
        if conf_key in conf:
            return _number(raw, key, conf[conf_key], corigin, f"{cwhere} {conf_key}", True)
        return default(key)

    if name == "static" or name == "etcd":
        s["rdzv.timeout_s"] = rdzv("rdzv.timeout_s", "timeout")
        s["rdzv.deadline_s"] = _renamed(s["rdzv.timeout_s"], "rdzv.deadline_s")
        if name == "etcd":
            s["rdzv.last_call_timeout_s"] = rdzv("rdzv.last_call_timeout_s",
                                                 "last_call_timeout")
    elif name in DYNAMIC:
        for key in ("join_timeout", "last_call_timeout", "close_timeout"):
            s[f"rdzv.{key}_s"] = rdzv(f"rdzv.{key}_s", key)
        if name == "c10d":
            s["rdzv.read_timeout_s"] = rdzv("rdzv.read_timeout_s", "read_timeout")
        s["rdzv.deadline_s"] = _renamed(s["rdzv.join_timeout_s"], "rdzv.deadline_s")
    else:
        s["rdzv.deadline_s"] = unknown("rdzv.deadline_s", f"rendezvous backend {name!r} is "
                                                          "not one torch ships")
    for dest, key, integer in (("max_restarts", "torchrun.max_restarts", True),
                               ("monitor_interval", "torchrun.monitor_interval_s", False),
                               ("shutdown_timeout", "torchrun.shutdown_timeout_s", True)):
        got = text(dest)
        if got is not None:
            s[key] = _number(raw, key, got[0], got[1], got[2], integer)
        elif dest == "shutdown_timeout" and "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" in env:
            s[key] = _number(raw, key, env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"], ENV,
                             "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", True)
        else:
            s[key] = default(key)
    s["torchrun.exit_barrier_timeout_s"] = default("torchrun.exit_barrier_timeout_s")
    s["torchrun.nnodes_max"] = origin.get("nnodes") or Setting(
        "torchrun.nnodes_max", 1, "default", "torch/distributed/run.py --nnodes 1:1")
    node_rank = text("node_rank")
    port = text("master_port")
    tr = Torchrun(
        nnodes_min=nmin, nnodes_max=nmax,
        nproc_per_node=(text("nproc_per_node") or ("1",))[0], rdzv_backend=name,
        rdzv_endpoint=(text("rdzv_endpoint") or (None,))[0],
        rdzv_id=(text("rdzv_id") or ("none",))[0], rdzv_conf=MappingProxyType(conf),
        standalone=standalone, max_restarts=_int(s["torchrun.max_restarts"]),
        monitor_interval_s=s["torchrun.monitor_interval_s"].seconds,
        shutdown_timeout_s=s["torchrun.shutdown_timeout_s"].seconds,
        node_rank=_int_text(node_rank[0]) if node_rank else 0,
        master_addr=(text("master_addr") or ("127.0.0.1",))[0],
        master_port=_int_text(port[0]) if port else None,
        origin=MappingProxyType({**origin, "rdzv_backend": bsetting}))
    return tr, tuple(raw.script), s, tuple(raw.problems)


def _renamed(s: Setting, key: str) -> Setting:
    return Setting(key, s.value, s.origin, s.where)


def _int(s: Setting) -> int | None:
    return int(s.value) if s.known and isinstance(s.value, int | float) else None


def _int_text(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None

