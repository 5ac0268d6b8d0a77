"""Every line of a torchrun child with its rank, without flags the user must remember.

Plain torchrun lets its workers write to the inherited pipes: nothing says which rank wrote a
line, and a rank's unterminated write merges with another rank's line. torchrun reads its
options from the environment too (`PET_<OPTION>`, torch/distributed/argparse_util.py), and
its tee prefixes each console line of a worker with a template
(`TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`, torch >= 2.2; `${rank}` is the global rank). So the
agent gives the command, when it has not chosen otherwise:

- `PET_TEE=3`: both streams of every worker go through torchrun's tee (a file per worker,
  tailed line by line to torchrun's own stdout/stderr);
- `TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=[rank${rank}]:`: each such line starts with the
  worker's global rank, the prefix the rules and `faultwatch logs` already read;
- `PET_LOG_DIR`: the tee's files in a directory of the agent's, removed when it exits
  (torch's default is a new /tmp directory per launch that nobody removes);
- `PYTHONUNBUFFERED=1`: the tee writes to torchrun's own stdout, block-buffered into a pipe:
  the lines would reach the agent in 8 KiB lumps, which looks like silence.

Only what the installed torch understands is set: its torch/distributed/run.py is read (never
imported) from the command's interpreter when the command names one (`torchrun`, `python -m
torch.distributed.run`), else from the agent's. A torch without the template, a user's own
`PET_TEE`/`PET_REDIRECTS`/template, or FAULTWATCH_TORCHRUN_RANKS=off: nothing is set.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from faultwatch import settings

TEMPLATE_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
TEMPLATE = "[rank${rank}]:"
OFF_ENV = settings.TORCHRUN_RANKS.name
USER_KEYS = ("PET_TEE", "PET_REDIRECTS", TEMPLATE_ENV)  # the user chose: leave torchrun be
_READ_LIMIT = 1 << 20


def _interpreter(cmd: Sequence[str]) -> str | None:
    """The Python that runs the command's torchrun: cmd[0] itself when it is a python, or the
    shebang of a `torchrun` script; None when the command does not say (a shell script)."""
    if not cmd:
        return None
    exe = shutil.which(cmd[0]) or cmd[0]
    name = os.path.basename(exe)
    if name.startswith("python"):
        return exe
    if name != "torchrun":
        return None
    try:
        with open(exe, "rb") as f:
            first = f.readline(4096)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    parts = first[2:].decode(errors="replace").split()
    return parts[0] if parts and os.path.basename(parts[0]).startswith("python") else None


def run_py(cmd: Sequence[str]) -> Path | None:
    """torch/distributed/run.py of the torch the command will use, else the agent's own."""
    py = _interpreter(cmd)
    if py is not None:
        prefix = Path(py).parent.parent
        found = sorted(glob.glob(str(prefix / "lib" / "python3*" / "site-packages" / "torch"
                                     / "distributed" / "run.py")))
        if found:
            return Path(found[-1])
    try:
        spec = importlib.util.find_spec("torch")  # finds, never imports
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "distributed" / "run.py"
    return path if path.is_file() else None


def understands(run_py_text: str) -> bool:
    """Whether that torchrun takes the prefix template from the environment and its --tee
    from PET_TEE."""
    return TEMPLATE_ENV in run_py_text and "--tee" in run_py_text


def rank_env(cmd: Sequence[str], env: Mapping[str, str], log_dir: Path
             ) -> tuple[dict[str, str], str]:
    """(the variables to add to the command's environment, why / what): empty when the user
    chose otherwise or the torch found does not understand them."""
    if not settings.TORCHRUN_RANKS.value(env):
        return {}, f"off (${OFF_ENV})"
    mine = [k for k in USER_KEYS if env.get(k)]
    if mine:
        return {}, "the command's own " + ",".join(mine)
    path = run_py(cmd)
    if path is None:
        return {}, "no torch found"
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(_READ_LIMIT)
    except OSError:
        return {}, "no torch found"
    if not understands(text):
        return {}, f"{path} has no {TEMPLATE_ENV}"
    out = {"PET_TEE": "3", TEMPLATE_ENV: TEMPLATE}
    if not env.get("PET_LOG_DIR"):
        out["PET_LOG_DIR"] = str(log_dir)
    if "PYTHONUNBUFFERED" not in env:
        out["PYTHONUNBUFFERED"] = "1"
    return out, f"tee with {TEMPLATE} ({path})"
