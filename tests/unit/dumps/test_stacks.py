"""Classifying ranks from their Python stacks (py-spy's JSON shape)."""

from __future__ import annotations

from typing import Any

from faultwatch.dumps.stacks import CHECKPOINT, COLLECTIVE, DATA, analyse, classify, needs_native

SITE = "/venv/lib/python3.11/site-packages"


def th(*frames: tuple[str, str, int], name: str = "MainThread") -> list[dict[str, Any]]:
    return [{"thread_name": name, "frames": [{"name": n, "filename": f, "line": ln}
                                             for n, f, ln in frames]}]


IN_ALLREDUCE = th(("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 4181),
                  ("wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83),
                  ("train_step", "/job/train.py", 42))
SLEEPING = th(("<module>", "/job/train.py", 17))
SAVING = th(("_save", f"{SITE}/torch/serialization.py", 900),
            ("save", f"{SITE}/torch/serialization.py", 850),
            ("checkpoint", "/job/train.py", 60))


def test_rank_outside_the_collective_is_the_culprit_with_its_line() -> None:
    f = analyse({0: IN_ALLREDUCE, 1: SLEEPING})
    assert f.culprits == (1,)
    assert f.summary == "rank 0 in all_reduce; rank 1 is at train.py:17 in <module>"
    assert f.ranks[0].at == "train.py:42 in train_step"


def test_positive_control_every_rank_in_collectives() -> None:
    f = analyse({0: IN_ALLREDUCE, 1: IN_ALLREDUCE})
    assert f.culprits == () and f.in_collective == (0, 1)


def test_checkpoint_write_is_recognised() -> None:
    assert classify(0, SAVING).state == CHECKPOINT
    f = analyse({0: SAVING, 1: SAVING})
    assert f.checkpointing and f.culprits == ()
    safet = th(("save_file", f"{SITE}/safetensors/torch.py", 280), ("main", "/job/t.py", 5))
    assert classify(1, safet).state == CHECKPOINT


def test_data_loading_and_main_thread_choice() -> None:
    loader = th(("_next_data", f"{SITE}/torch/utils/data/dataloader.py", 700),
                ("main", "/job/t.py", 9))
    assert classify(0, loader).state == DATA
    threads = th(("run", "/x/threading.py", 1), name="Thread-1") + IN_ALLREDUCE
    assert classify(0, threads).state == COLLECTIVE


def test_junk_is_unknown_not_an_error() -> None:
    assert classify(0, [{"frames": [None, {"line": "x"}]}]).state in ("unknown", "elsewhere")
    assert analyse({}).culprits == ()


def _native(name: str, so: str = "/x/site-packages/torch/lib/libtorch_cpu.so") -> dict:
    return {"name": name, "filename": so, "module": so, "line": 0}


def _py(name: str, filename: str, line: int) -> dict:
    return {"name": name, "filename": filename, "module": None, "line": line}


# rank 0 of a real DDP job (gloo) whose rank 1 stopped before backward, as py-spy --native
# printed it (torch 2.15): the gradient all-reduce has no Python frame
DDP_WAIT = [{"thread_name": "MainThread", "active": False, "frames": [
    _native("pthread_cond_wait", "/usr/lib/x86_64-linux-gnu/libc.so.6"),
    _native("std::condition_variable::wait", "/usr/lib/libstdc++.so.6"),
    _native("c10d::Reducer::finalize_backward"),
    _native("torch::autograd::GraphTask::exec_post_processing"),
    _native("THPEngine_run_backward", "/x/site-packages/torch/lib/libtorch_python.so"),
    _py("_engine_run_backward", "/x/site-packages/torch/autograd/graph.py", 1113),
    _py("backward", "/x/site-packages/torch/autograd/__init__.py", 395),
    _py("Tensor.backward", "/x/site-packages/torch/_tensor.py", 623),
    _py("<module>", "/w/ddp_stall.py", 36)]}]
NATIVE_SLEEP = [{"thread_name": "MainThread", "active": False, "frames": [
    _native("clock_nanosleep", "/usr/lib/x86_64-linux-gnu/libc.so.6"),
    _native("time_sleep", "/usr/lib/libpython3.11.so.1.0"),
    _py("<module>", "/w/ddp_stall.py", 34)]}]


def test_ddp_gradient_all_reduce_in_backward_is_a_collective_from_native_frames() -> None:
    a = classify(0, DDP_WAIT)
    assert (a.state, a.op, a.at) == ("collective", "DDP gradient all_reduce",
                                     "ddp_stall.py:36 in <module>")
    assert a.frames[0] == "graph.py:1113 in _engine_run_backward" and a.idle is True
    found = analyse({0: DDP_WAIT, 1: NATIVE_SLEEP})
    assert found.culprits == (1,)
    assert found.summary == "rank 0 in DDP gradient all_reduce; rank 1 is at " \
                            "ddp_stall.py:34 in <module>"
    # the Python view alone cannot tell: the agent asks py-spy for native frames then
    python_only = [{**DDP_WAIT[0], "frames": [f for f in DDP_WAIT[0]["frames"]
                                              if f["module"] is None]}]
    assert classify(0, python_only).state == "elsewhere" and needs_native(python_only)
    assert not needs_native([{**python_only[0], "active": True}])  # computing: no pause
    assert not needs_native(NATIVE_SLEEP)  # idle in the user's own code: Python says it all


def test_ddp_broadcast_before_forward_is_a_collective_from_python_frames() -> None:
    th = [{"thread_name": "MainThread", "active": False, "frames": [
        _py("_distributed_broadcast_coalesced",
            "/x/site-packages/torch/nn/parallel/distributed.py", 2100),
        _py("_sync_module_buffers", "/x/site-packages/torch/nn/parallel/distributed.py", 2200),
        _py("forward", "/x/site-packages/torch/nn/parallel/distributed.py", 1600),
        _py("<module>", "/w/train.py", 30)]}]
    a = classify(0, th)
    assert (a.state, a.op) == ("collective", "DDP distributed_broadcast_coalesced")
    gloo = [{"thread_name": "MainThread", "active": False, "frames": [
        _native("gloo::transport::tcp::UnboundBuffer::waitRecv"),
        _py("<module>", "/w/train.py", 31)]}]
    assert classify(0, gloo).state == "collective"
