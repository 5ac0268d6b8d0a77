"""Reading the ranks' Python stacks: who is inside a collective, a checkpoint write, or elsewhere.

Input: per global rank, the threads of its process as `py-spy dump --json` prints them (a list
of {"thread_name", "frames": [{"name", "filename", "line"}, ...innermost first]}) or as the
SDK's faulthandler-style dump writes them (same shape). Pure: no I/O, no torch import.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# torch.distributed's collective and point-to-point entry points (distributed_c10d.py) and the
# wrappers frameworks put around them (DeepSpeed's comm, Megatron's parallel_state users call
# torch.distributed directly).
COLLECTIVES = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
    "all_to_all_single", "barrier", "monitored_barrier", "broadcast", "broadcast_object_list",
    "gather", "gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter",
    "scatter_object_list", "send", "recv", "isend", "irecv", "batch_isend_irecv",
    "_all_gather_base", "_reduce_scatter_base", "wait", "synchronize",
})
_DIST_FILE = re.compile(r"torch/distributed/(distributed_c10d|_functional_collectives|"
                        r"c10d_logger)\.py$|deepspeed/comm/")
# checkpoint and file writes: torch.save, safetensors, torch.distributed.checkpoint, the
# frameworks' save paths, plain file I/O.
_CKPT_FILE = re.compile(r"torch/serialization\.py$|safetensors/|torch/distributed/checkpoint/|"
                        r"transformers/modeling_utils\.py$|lightning/.*checkpoint|"
                        r"huggingface_hub/.*serialization")
_CKPT_FUNC = re.compile(r"^(_?save(_checkpoint|_model|_pretrained|_file|_state_dict)?|"
                        r"_save_checkpoint|save_checkpoint|dump|write|flush|fsync|"
                        r"_write_item|write_data|_legacy_save|_save)$")
# DDP's own collectives (torch/nn/parallel/distributed.py): buffer and parameter broadcasts
# before forward, the unused-parameter and join all-reduces; they call the C++ binding
# (dist._broadcast_coalesced) or distributed_c10d with these frames above it.
_DDP_FILE = re.compile(r"torch/nn/parallel/distributed\.py$")
_DDP_COLLECTIVE_FUNC = re.compile(
    r"^_(sync_buffers|sync_module_buffers|default_broadcast_coalesced|"
    r"distributed_broadcast_coalesced|sync_params_and_buffers|"
    r"check_global_requires_backward_grad_sync|match_all_reduce_for_bwd_pass|"
    r"match_unused_params_allreduce|find_common_rank)$")
# Native frames (py-spy --native) of a thread blocked in communication, from torch's c10d
# (torch/csrc/distributed/c10d: the Reducer that all-reduces DDP's gradient buckets from an
# autograd hook and waits for them in finalize_backward; Work/Future waits; the
# ProcessGroup backends) and the gloo library. DDP's gradient all-reduce has no Python frame:
# the main thread sits in autograd's _engine_run_backward.
_NATIVE_REDUCER = re.compile(r"^c10d::Reducer::(finalize_backward|finalize_backward_manual|"
                             r"all_reduce_bucket|all_reduce_local_used_map|delay_all_reduce|"
                             r"mark_bucket_ready|ensure_prior_reduction_finished)")
_NATIVE_COMM = re.compile(r"^(c10d::(ProcessGroup\w*|\w*Work\w*|broadcast_coalesced|"
                          r"detail::\w+)|gloo::|ncclGroupEnd|ncclComm|c10::ivalue::Future::wait)")
_DATA_FILE = re.compile(r"torch/utils/data/(dataloader|_utils/fetch)\.py$")
# Compiling: torch.compile (dynamo, inductor and its compile workers), triton, TorchScript, FX.
_COMPILE_FILE = re.compile(r"torch/(_dynamo|_inductor|_functorch|fx|jit|export)/|/triton/")
# Network and file transfers from Python: sockets, TLS, HTTP clients and the object-store and
# hub SDKs (an upload to object storage), file copies, waiting on a subprocess (`aws s3 cp`).
_TRANSFER_FILE = re.compile(r"/http/client\.py$|/(urllib3|requests|httpx|botocore|boto3|"
                            r"s3transfer|aiohttp|fsspec|s3fs|gcsfs|adlfs|huggingface_hub)/|"
                            r"google/cloud/storage|azure/storage")
_IO_FILE = re.compile(_TRANSFER_FILE.pattern + r"|/(socket|ssl|shutil|subprocess)\.py$")
_LIBRARY = re.compile(r"/(site|dist)-packages/|/lib/python3\.\d+/|^<frozen |^<string>")

COLLECTIVE, CHECKPOINT, DATA, COMPILE, IO, ELSEWHERE, UNKNOWN = (
    "collective", "checkpoint", "data", "compile", "io", "elsewhere", "unknown")
STATES = (COLLECTIVE, CHECKPOINT, DATA, COMPILE, IO, ELSEWHERE, UNKNOWN)
# States in which a rank works toward something outside communication, whatever its CPU says:
# a silence with such a rank is no evidence of a hang (core/diagnosis.py assess()).
WORKING = frozenset({CHECKPOINT, COMPILE, IO})
WHAT = {CHECKPOINT: "writing a checkpoint", DATA: "loading data", COMPILE: "compiling",
        IO: "in I/O", ELSEWHERE: "in user code", COLLECTIVE: "in a collective",
        UNKNOWN: "unknown"}


@dataclass(frozen=True, slots=True)
class Frame:
    name: str
    filename: str
    line: int
    native: bool = False  # a C/C++ frame (py-spy --native marks them with their `module`)

    def where(self) -> str:
        return f"{self.filename.rsplit('/', 1)[-1]}:{self.line} in {self.name}"


@dataclass(frozen=True, slots=True)
class RankActivity:
    """What one rank's main thread is doing."""

    rank: int
    state: str  # collective | checkpoint | data | elsewhere | unknown
    op: str | None  # the collective or save function, when known
    at: str | None  # innermost frame of the user's code ("train.py:42 in step")
    frames: tuple[str, ...] = ()  # a few innermost frames, innermost first
    idle: bool | None = None  # off CPU when captured (py-spy's `active`); None: not known
    # other threads of the rank working outside communication ("name: io at x.py:3 in send"):
    # an upload or checkpoint thread the main thread waits for
    others: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """What an agent ships for this rank (a digest: a few hundred bytes)."""
        d: dict[str, Any] = {"state": self.state, "op": self.op, "at": self.at,
                             "frames": list(self.frames), "idle": self.idle}
        if self.others:
            d["others"] = list(self.others)
        return d

    @classmethod
    def from_dict(cls, rank: int, d: Mapping[str, Any]) -> RankActivity:
        """The activity a shipped digest describes (unknown states read as `unknown`)."""
        state = str(d.get("state") or UNKNOWN)
        if state not in STATES:
            state = UNKNOWN
        op, at = d.get("op"), d.get("at")
        frames = d.get("frames") or ()
        idle = d.get("idle")
        others = d.get("others") or ()
        return cls(rank, state, None if op is None else str(op)[:200],
                   None if at is None else str(at)[:300],
                   tuple(str(f)[:300] for f in frames[:6]) if isinstance(frames, list) else (),
                   idle if isinstance(idle, bool) else None,
                   tuple(str(o)[:300] for o in others[:MAX_OTHERS])
                   if isinstance(others, list) else ())


def _frames(thread: Mapping[str, Any]) -> list[Frame]:
    out = []
    for f in thread.get("frames") or ():
        if isinstance(f, Mapping):
            try:
                out.append(Frame(str(f.get("name", "?")), str(f.get("filename", "?")),
                                 int(f.get("line") or 0), f.get("module") is not None))
            except (TypeError, ValueError):
                continue
    return out


def _main(threads: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    for t in threads:
        if t.get("main") or t.get("thread_name") == "MainThread":
            return t
    return threads[0] if threads else None


def main_thread(threads: Sequence[Mapping[str, Any]]) -> list[Frame]:
    """The main thread's frames (py-spy names it MainThread; the SDK dump marks `main`)."""
    t = _main(threads)
    return _frames(t) if t is not None else []


def classify(rank: int, threads: Sequence[Mapping[str, Any]]) -> RankActivity:
    """The state of a rank from its threads' stacks (main thread decides)."""
    t = _main(threads)
    every = _frames(t) if t is not None else []
    frames = [f for f in every if not f.native] or every  # what a person reads: Python
    if not frames:
        return RankActivity(rank, UNKNOWN, None, None)
    active = t.get("active") if t is not None else None
    idle = (not active) if isinstance(active, bool) else None
    user = next((f for f in frames if not _LIBRARY.search(f.filename)), None)
    at = user.where() if user else frames[0].where()
    shown = tuple(f.where() for f in frames[:6])
    for f in frames:
        if _DIST_FILE.search(f.filename) and f.name in COLLECTIVES:
            return RankActivity(rank, COLLECTIVE, f.name, at, shown, idle)
        if _DDP_FILE.search(f.filename) and _DDP_COLLECTIVE_FUNC.match(f.name):
            return RankActivity(rank, COLLECTIVE, f"DDP {f.name.strip('_')}", at, shown, idle)
    for f in every:
        if f.native and _NATIVE_REDUCER.match(f.name):
            return RankActivity(rank, COLLECTIVE, "DDP gradient all_reduce", at, shown, idle)
    for f in every:
        if f.native and _NATIVE_COMM.match(f.name):
            op = f.name.split("(")[0][:120]
            return RankActivity(rank, COLLECTIVE, op, at, shown, idle)
    for f in frames:
        if _CKPT_FILE.search(f.filename) or (_CKPT_FUNC.match(f.name) and "save" in f.name):
            return RankActivity(rank, CHECKPOINT, f.name, at, shown, idle)
    others = _working_threads(threads, t)
    for f in frames:
        if _DATA_FILE.search(f.filename):
            return RankActivity(rank, DATA, f.name, at, shown, idle, others)
    for f in frames:
        if _COMPILE_FILE.search(f.filename):
            return RankActivity(rank, COMPILE, f.name, at, shown, idle, others)
    for f in frames:
        if _IO_FILE.search(f.filename):
            return RankActivity(rank, IO, f.name, at, shown, idle, others)
    return RankActivity(rank, ELSEWHERE, None, at, shown, idle, others)


MAX_OTHERS = 3


def _thread_state(frames: list[Frame]) -> tuple[str, str] | None:
    """(state, function) when a background thread's Python frames show a checkpoint write,
    compiling or a transfer (an HTTP or object-store client: an upload); None otherwise. A
    thread idle in a plain socket, a selector or a lock (a metrics server, an event loop, a
    progress bar's monitor) works at nothing."""
    for f in frames:
        if _CKPT_FILE.search(f.filename):
            return CHECKPOINT, f.name
    for f in frames:
        if _COMPILE_FILE.search(f.filename):
            return COMPILE, f.name
    for f in frames:
        if _TRANSFER_FILE.search(f.filename):
            return IO, f.name
    return None


def _working_threads(threads: Sequence[Mapping[str, Any]],
                     main: Mapping[str, Any] | None) -> tuple[str, ...]:
    """Threads besides the main one that write a checkpoint, compile or do I/O."""
    out: list[str] = []
    for th in threads:
        if th is main or len(out) >= MAX_OTHERS:
            continue
        frames = [f for f in _frames(th) if not f.native]
        got = _thread_state(frames)
        if got is not None:
            out.append(f"{str(th.get('thread_name') or '?')[:40]}: {got[0]} in {got[1]}"
                       f" at {frames[0].where()}")
    return tuple(out)


_TORCH_FILE = re.compile(r"/torch/[^/]+")


def needs_native(threads: Sequence[Mapping[str, Any]]) -> bool:
    """Whether only native frames can tell what the rank waits for: its main thread is off
    CPU inside torch (autograd's backward, a C++ binding) and its Python frames show no
    collective, checkpoint or data loading (DDP's gradient all-reduce looks like this).
    py-spy must pause a process to unwind native frames: only such idle ranks are asked."""
    t = _main(threads)
    frames = _frames(t) if t is not None else []
    if not frames or t is None or t.get("active") is not False:
        return False
    return bool(_TORCH_FILE.search(frames[0].filename)) \
        and classify(0, threads).state == ELSEWHERE


@dataclass(frozen=True)
class StackFindings:
    """Every rank's activity and what it implies for a hang decision."""

    ranks: dict[int, RankActivity]
    in_collective: tuple[int, ...]
    in_checkpoint: tuple[int, ...]
    culprits: tuple[int, ...]  # ranks not in the collective the others wait in
    summary: str

    @property
    def checkpointing(self) -> bool:
        """A rank writes a checkpoint: silence may be legitimate (extend, do not decide)."""
        return bool(self.in_checkpoint)

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary, "culprit_ranks": list(self.culprits),
                "in_collective": list(self.in_collective),
                "in_checkpoint": list(self.in_checkpoint),
                "ranks": {str(r): {"state": a.state, "op": a.op, "at": a.at,
                                   "frames": list(a.frames)}
                          for r, a in sorted(self.ranks.items())}}


def analyse(stacks: Mapping[int, Sequence[Mapping[str, Any]]]) -> StackFindings:
    """Compare the ranks: the ones outside a collective that others wait in are culprits."""
    return compare({r: classify(r, th) for r, th in stacks.items()})


def compare(acts: Mapping[int, RankActivity]) -> StackFindings:
    """analyse() over activities already classified (digests shipped by many agents)."""
    acts = dict(acts)
    coll = tuple(sorted(r for r, a in acts.items() if a.state == COLLECTIVE))
    ckpt = tuple(sorted(r for r, a in acts.items() if a.state == CHECKPOINT))
    culprits: tuple[int, ...] = ()
    if coll:
        culprits = tuple(sorted(r for r, a in acts.items()
                                if a.state not in (COLLECTIVE, UNKNOWN)))
    parts = []
    if coll:
        ops = sorted({acts[r].op or "?" for r in coll})
        parts.append(f"{_ranks(coll)} in {'/'.join(ops)}")
    for r in culprits:
        a = acts[r]
        what = WHAT.get(a.state, "") if a.state != ELSEWHERE else ""
        parts.append(f"rank {r} is at {a.at}" + (f" ({what})" if what else "")
                     + (f" in {a.frames[0]}" if a.frames and a.frames[0] != a.at else ""))
    if not culprits and ckpt:
        parts.append(f"{_ranks(ckpt)} writing a checkpoint")
    if not parts:
        parts.append("no rank is inside a collective")
    return StackFindings(acts, coll, ckpt, culprits, "; ".join(parts))


def _ranks(rs: tuple[int, ...]) -> str:
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(str(r) for r in rs)
