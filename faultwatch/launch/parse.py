"""A command line and its environment to a typed launch description (pure): `parse(argv, env)`.

What runs what is peeled off first: `env [-i] [-u NAME] NAME=VALUE ...` (its assignments join
the environment the launch reads), `srun [options]`, `bash -c '...'` / `sh -c` with one
simple command (no `;`, pipes or redirections: anything else is a script nobody can read
without running it), `exec`. Then the launcher: `torchrun`, `python -m torch.distributed.run`
(and the deprecated `torch.distributed.launch`), `accelerate launch`, `deepspeed`, a plain
`python script.py`; anything else is an unknown launcher, whose values are unknown.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from faultwatch.launch.defaults import default
from faultwatch.launch.model import FLAG, UNKNOWN, Launch, Setting, unknown
from faultwatch.launch.torchrun import DYNAMIC, parse_torchrun
from faultwatch.launch.training import env_settings, script_settings

MAX_WRAPPERS = 8
SHELLS = ("bash", "sh", "dash", "zsh")
_SHELL_OPERATORS = (";", "&&", "||", "|", "&", ">", ">>", "<", "2>", "2>&1", "(", ")", "`")
TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
# srun options that take a value (Slurm 22.05.8 srun(1): `--name=<value>`; the optional ones
# take it only as `--name=value`), and its one-letter options that do
SRUN_VALUE = frozenset((
    "accel-bind account acctg-freq bb bbf bcast-exclude begin chdir cluster-constraint "
    "clusters comment constraint container core-spec cores-per-socket cpu-bind cpu-freq "
    "cpus-per-gpu cpus-per-task deadline delay-boot dependency distribution epilog error "
    "exclude export extra-node-info gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket "
    "gpus-per-task gres gres-flags het-group hint input job-name jobid licenses mail-type "
    "mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mincpus mpi msg-timeout network "
    "nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node "
    "ntasks-per-socket open-mode output partition power prefer priority profile prolog qos "
    "relative reservation signal slurmd-debug sockets-per-node switches task-epilog "
    "task-prolog thread-spec threads threads-per-core time time-min tmp uid wait wckey"
).split())
SRUN_SHORT_VALUE = frozenset("ABCDFGJLMNSTWbcdeimnopqrtwx")
# deepspeed's runner (deepspeed/launcher/runner.py): its store_true options; the rest take one
DEEPSPEED_FLAGS = frozenset(("--module", "--no_python", "--no_local_rank", "--no_ssh_check",
                             "--force_multi", "--save_pid", "--elastic_training",
                             "--bind_cores_to_rank"))
# `accelerate launch` (accelerate 1.16.0 commands/launch.py): its flags that take no value
ACCELERATE_FLAGS = frozenset((
    "--cpu --debug --downcast-bf16 --downcast_bf16 --dynamo-use-dynamic --dynamo_use_dynamic "
    "--dynamo-use-fullgraph --dynamo_use_fullgraph --dynamo-use-regional-compilation "
    "--dynamo_use_regional_compilation --enable-cpu-affinity --enable_cpu_affinity "
    "--fp8-use-autocast-during-eval --fp8_use_autocast_during_eval --help --module "
    "--multi-gpu --multi_gpu --no-python --no_python --no-tpu-cluster --no_tpu_cluster "
    "--quiet --same-network --same_network --tpu --tpu-cluster --tpu_cluster --tpu-use-sudo "
    "--tpu_use_sudo --use-deepspeed --use_deepspeed --use-fsdp --use_fsdp "
    "--use-megatron-lm --use_megatron_lm --use-parallelism-config --use_parallelism_config "
    "-h -m -q").split())
# accelerate's options that it hands to torch's elastic launch, as torchrun spells them
ACCELERATE_TO_TORCHRUN = {"--rdzv_backend": "--rdzv-backend", "--rdzv-backend": "--rdzv-backend",
                          "--rdzv_conf": "--rdzv-conf", "--rdzv-conf": "--rdzv-conf",
                          "--max_restarts": "--max-restarts", "--max-restarts": "--max-restarts",
                          "--monitor_interval": "--monitor-interval",
                          "--monitor-interval": "--monitor-interval",
                          "--num_machines": "--nnodes", "--num-machines": "--nnodes"}


def _base(tok: str) -> str:
    return tok.rsplit("/", 1)[-1]


def _is_python(tok: str) -> bool:
    b = _base(tok)
    return b.startswith("python") and all(c.isdigit() or c == "." for c in b[6:])


def _options(args: Sequence[str], takes: object) -> tuple[list[tuple[str, str]], int]:
    """Leading options of a launcher as (name, value) pairs and the index after them;
    `takes(name)` says whether an option without `=` takes the next token."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "-":
        tok = args[i]
        if tok == "--":
            return out, i + 1
        name, eq, val = tok.partition("=")
        if not eq and takes(name) and i + 1 < len(args):  # type: ignore[operator]
            val, i = args[i + 1], i + 1
        out.append((name, val))
        i += 1
    return out, i


def _srun_takes(name: str) -> bool:
    if name.startswith("--"):
        return name[2:] in SRUN_VALUE
    return len(name) == 2 and name[1] in SRUN_SHORT_VALUE


def _shell_command(args: Sequence[str], problems: list[str]) -> list[str] | None:
    """The one simple command of `bash -c STRING` (leading `exec` dropped), or None."""
    if "-c" not in args[:3]:
        return None
    i = list(args).index("-c")
    if i + 1 >= len(args):
        return None
    try:
        toks = shlex.split(args[i + 1])
    except ValueError as e:
        problems.append(f"{_base(args[0]) if args else 'shell'} -c: {e}")
        return None
    if any(t in _SHELL_OPERATORS or t.startswith(("$(", "`")) for t in toks):
        problems.append("a shell script (;, pipes, redirections): its launch is not read")
        return None
    return toks[1:] if toks[:1] == ["exec"] else toks


def _peel(argv: Sequence[str], env: dict[str, str], problems: list[str],
          settings: dict[str, Setting]) -> tuple[list[str], list[str]]:
    """(wrappers, the command left) after env, srun, shells and exec."""
    cmd = list(argv)
    wrappers: list[str] = []
    for _ in range(MAX_WRAPPERS):
        if not cmd:
            break
        head = _base(cmd[0])
        if head == "exec":
            cmd = cmd[1:]
        elif head == "env" or "=" in cmd[0] and not cmd[0].startswith("-"):
            rest = cmd[1:] if head == "env" else cmd
            while rest and (rest[0].startswith("-") or "=" in rest[0]):
                tok = rest.pop(0)
                if tok in ("-u", "-C", "--unset", "--chdir") and rest:
                    rest.pop(0)
                elif tok in ("-i", "--ignore-environment", "-"):
                    env.clear()
                elif "=" in tok and not tok.startswith("-"):
                    k, _, v = tok.partition("=")
                    env[k] = v
            wrappers.append("env")
            cmd = rest
        elif head == "srun":
            opts, i = _options(cmd[1:], _srun_takes)
            for name, val in opts:
                if name == "--signal":
                    settings["slurm.step_signal"] = Setting("slurm.step_signal", val, FLAG,
                                                            "srun --signal")
            wrappers.append("srun")
            cmd = cmd[1 + i:]
        elif head in SHELLS:
            inner = _shell_command(cmd[1:], problems)
            if inner is None:
                break
            wrappers.append(f"{head} -c")
            cmd = inner
        else:
            break
    return wrappers, cmd


def _torchrun(args: Sequence[str], env: Mapping[str, str], launcher: str,
              wrappers: list[str], argv: Sequence[str], problems: list[str],
              settings: dict[str, Setting], training: bool = True) -> Launch:
    tr, script, s, more = parse_torchrun(args, env)
    problems += more
    settings.update(s)
    if training:
        settings.update(script_settings(script, problems))
        settings.update({k: v for k, v in env_settings(env, "torchrun", problems).items()
                         if k not in settings})
        _pg_defaults(settings)
    return Launch(tuple(argv), launcher, tuple(wrappers), tr, script,
                  MappingProxyType(settings), tuple(problems))


def parse(argv: Sequence[str], env: Mapping[str, str], *, training: bool = True) -> Launch:
    """The launch described by `argv` run with `env` (nothing is run or read); with
    `training` false only the launcher's own options are read (not the script's arguments
    nor the NCCL variables: what the processor needs of every RunStart, cheaply)."""
    problems: list[str] = []
    settings: dict[str, Setting] = {}
    e = dict(env)
    wrappers, cmd = _peel(argv, e, problems, settings)
    if not cmd:
        problems.append("no command")
        return Launch(tuple(argv), UNKNOWN, tuple(wrappers), problems=tuple(problems))
    head = _base(cmd[0])
    if head == "torchrun":
        return _torchrun(cmd[1:], e, "torchrun", wrappers, argv, problems, settings, training)
    if _is_python(cmd[0]):
        j = 1
        while j < len(cmd) and cmd[j].startswith("-") and cmd[j] != "-m":
            j += 2 if cmd[j] in ("-X", "-W", "-c") else 1
        if j + 1 < len(cmd) and cmd[j] == "-m" and cmd[j + 1] in TORCHRUN_MODULES:
            return _torchrun(cmd[j + 2:], e, "torchrun", wrappers, argv, problems, settings,
                             training)
        script = tuple(cmd[j:])
        if training:
            settings.update(script_settings(script, problems))
            settings.update(env_settings(e, "python", problems))
            _pg_defaults(settings)
        return Launch(tuple(argv), "python", tuple(wrappers), None, script,
                      MappingProxyType(settings), tuple(problems))
    if head == "accelerate" and cmd[1:2] == ["launch"]:
        opts, i = _options(cmd[2:], lambda n: n not in ACCELERATE_FLAGS)
        targs = [f"{ACCELERATE_TO_TORCHRUN[n]}={v}" for n, v in opts
                 if n in ACCELERATE_TO_TORCHRUN]
        plain = {k: v for k, v in e.items() if not k.startswith("PET_")}  # not torchrun's
        launch = _torchrun([*targs, *cmd[2 + i:]], plain, "accelerate", wrappers, argv,
                           problems, settings)
        return _accelerate_unknowns(launch, {ACCELERATE_TO_TORCHRUN[n] for n, _ in opts
                                             if n in ACCELERATE_TO_TORCHRUN})
    if head == "deepspeed":
        opts, i = _options(cmd[1:], lambda n: n not in DEEPSPEED_FLAGS)
        script = tuple(cmd[1 + i:])
        settings.update(env_settings(e, "deepspeed", problems))
        settings.update(script_settings(script, problems))
        settings["rdzv.deadline_s"] = unknown(
            "rdzv.deadline_s", "deepspeed: the workers meet in init_process_group's store "
                               "(its timeout: pg.timeout_s)")
        return Launch(tuple(argv), "deepspeed", tuple(wrappers), None, script,
                      MappingProxyType(settings), tuple(problems))
    problems.append(f"unknown launcher {head!r}: its timeouts are not read")
    settings.update(env_settings(e, UNKNOWN, problems))
    return Launch(tuple(argv), UNKNOWN, tuple(wrappers), None, tuple(cmd),
                  MappingProxyType(settings), tuple(problems))


def _pg_defaults(settings: dict[str, Setting]) -> None:
    """torch's own init_process_group timeouts where no flag set one."""
    for backend in ("nccl", "gloo"):
        key = f"pg.timeout_s.{backend}"
        if key not in settings:
            d = default(key)
            settings[key] = Setting(key, d.value, d.origin,
                                    f"{d.where}, unless the script passes timeout=")


def _accelerate_unknowns(launch: Launch, given: set[str]) -> Launch:
    """accelerate's config file (not read) may set what its command line does not: its
    rendezvous, restarts and monitor interval are unknown unless given as flags."""
    why = "not on accelerate's command line; its config file (not read) may set it"
    rdzv_given = {"--rdzv-backend", "--rdzv-conf"} <= given
    s = dict(launch.settings)
    for key, setting in launch.settings.items():
        if setting.origin != "default":
            continue
        if (key.startswith("rdzv.") and not rdzv_given) \
                or (key == "torchrun.max_restarts" and "--max-restarts" not in given) \
                or (key == "torchrun.monitor_interval_s" and "--monitor-interval" not in given):
            s[key] = unknown(key, why)
    return Launch(launch.argv, launch.launcher, launch.wrappers, launch.torchrun,
                  launch.script, MappingProxyType(s), launch.problems)


def start_deadline_s(launch: Launch) -> float | None:
    """How long the launcher itself waits for the job's nodes before it fails the launch
    (the rendezvous deadline, plus the last call of a dynamic rendezvous whose node count
    is a range), or None when that is unknown."""
    d = launch.get("rdzv.deadline_s").seconds
    if d is None:
        return None
    tr = launch.torchrun
    if tr is not None and tr.rdzv_backend in DYNAMIC and tr.nnodes_min != tr.nnodes_max:
        d += launch.get("rdzv.last_call_timeout_s").seconds or 0.0
    return d
