"""What the training processes read themselves: the frameworks' timeout flags among the script's
arguments, and torch's ProcessGroupNCCL variables in the environment (pure).

A command line cannot say whose script it runs, so a framework's flag counts only when it is
given (Megatron-LM `--distributed-timeout-minutes`, Hugging Face `--ddp_timeout`); without
one, init_process_group's timeout is torch's default for the backend (600 s NCCL, 1800 s
others), unless the script passes `timeout=` in code (Lightning's DDPStrategy(timeout=),
Accelerate's InitProcessGroupKwargs): the check says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from faultwatch.launch.defaults import DEEPSPEED_TIMEOUT_MIN, default
from faultwatch.launch.model import ENV, FLAG, Setting, unknown

# flag -> (setting key, unit factor to seconds (None: a count), framework)
_SCRIPT_FLAGS: dict[str, tuple[str, float | None, str]] = {
    "--distributed-timeout-minutes": ("pg.timeout_s", 60.0, "Megatron-LM"),
    "--ddp_timeout": ("pg.timeout_s", 1.0, "transformers"),
    "--ddp-timeout": ("pg.timeout_s", 1.0, "transformers"),
    "--save-interval": ("checkpoint.interval_steps", None, "Megatron-LM"),
    "--save_steps": ("checkpoint.interval_steps", None, "transformers"),
    "--save-steps": ("checkpoint.interval_steps", None, "transformers"),
}
# Megatron-LM: on SIGTERM save a checkpoint, then exit (the stop grace must cover a save)
SAVE_ON_SIGTERM = "--exit-signal-handler"
_TRUE, _FALSE = ("1", "true", "yes", "on", "y"), ("0", "false", "no", "off", "n")


def _number(key: str, text: str, factor: float | None, where: str, origin: str,
            problems: list[str]) -> Setting:
    try:
        n = float(text)
    except ValueError:
        problems.append(f"{where}: {text!r} is not a number")
        return unknown(key, f"{where}={text!r} is not a number")
    return Setting(key, n * factor if factor is not None else int(n), origin, where)


def script_settings(script: Sequence[str], problems: list[str]) -> dict[str, Setting]:
    """The timeout-related settings among a training script's arguments."""
    out: dict[str, Setting] = {}
    args = list(script[1:])
    for i, tok in enumerate(args):
        name, eq, val = tok.partition("=")
        if name == SAVE_ON_SIGTERM:
            out["framework.save_on_sigterm"] = Setting("framework.save_on_sigterm", True, FLAG,
                                                       f"{SAVE_ON_SIGTERM} (Megatron-LM)")
        spec = _SCRIPT_FLAGS.get(name)
        if spec is None:
            continue
        if not eq:
            if i + 1 >= len(args):
                problems.append(f"{name} has no value")
                continue
            val = args[i + 1]
        key, factor, who = spec
        out[key] = _number(key, val, factor, f"{name} ({who})", FLAG, problems)
    if "pg.timeout_s" in out:  # init_process_group(timeout=...) whatever the backend
        for backend in ("nccl", "gloo"):
            s = out["pg.timeout_s"]
            out[f"pg.timeout_s.{backend}"] = Setting(f"pg.timeout_s.{backend}", s.value,
                                                     s.origin, s.where)
    return out


def _flag(env: Mapping[str, str], names: Sequence[str], key: str,
          problems: list[str]) -> Setting | None:
    for var in names:
        if var in env:
            v = env[var].strip().lower()
            if v in _TRUE or v in _FALSE:
                return Setting(key, v in _TRUE, ENV, var)
            problems.append(f"{var}={env[var]!r} is not a boolean")
            return unknown(key, f"{var}={env[var]!r} is not a boolean")
    return None


def _int_env(env: Mapping[str, str], names: Sequence[str], key: str,
             problems: list[str]) -> Setting | None:
    for var in names:
        if var in env:
            try:
                return Setting(key, int(env[var].strip()), ENV, var)
            except ValueError:
                problems.append(f"{var}={env[var]!r} is not an integer")
                return unknown(key, f"{var}={env[var]!r} is not an integer")
    return None


def env_settings(env: Mapping[str, str], launcher: str,
                 problems: list[str]) -> dict[str, Setting]:
    """torch's ProcessGroupNCCL variables (TORCH_ names, then their deprecated NCCL_ ones),
    and DeepSpeed's DEEPSPEED_TIMEOUT under the deepspeed launcher."""
    out: dict[str, Setting] = {}
    hb = _int_env(env, ("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",), "nccl.heartbeat_timeout_s",
                  problems)
    out["nccl.heartbeat_timeout_s"] = hb or default("nccl.heartbeat_timeout_s")
    mon = _flag(env, ("TORCH_NCCL_ENABLE_MONITORING",), "nccl.enable_monitoring", problems)
    out["nccl.enable_monitoring"] = mon or default("nccl.enable_monitoring")
    aeh = _int_env(env, ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"),
                   "nccl.async_error_handling", problems)
    if aeh is None:
        aeh = default("nccl.async_error_handling") if launcher == "torchrun" else unknown(
            "nccl.async_error_handling", "not set: ProcessGroupNCCL's default (3) unless the "
                                         "launcher sets it (torchrun: 1)")
    out["nccl.async_error_handling"] = aeh
    bw = _flag(env, ("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"), "nccl.blocking_wait",
               problems)
    out["nccl.blocking_wait"] = bw or default("nccl.blocking_wait")
    if launcher == "deepspeed":
        ds = env.get("DEEPSPEED_TIMEOUT")
        s = (_number("pg.timeout_s", ds, 60.0, "DEEPSPEED_TIMEOUT", ENV, problems)
             if ds is not None else DEEPSPEED_TIMEOUT_MIN.setting("pg.timeout_s"))
        if ds is None:
            s = Setting("pg.timeout_s", 60.0 * float(s.value or 0), s.origin, s.where)
        for backend in ("nccl", "gloo"):
            out[f"pg.timeout_s.{backend}"] = Setting(f"pg.timeout_s.{backend}", s.value,
                                                     s.origin, s.where)
    return out
