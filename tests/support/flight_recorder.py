"""Hand-made Flight Recorder dumps shaped like torch 2.x gloo/NCCL dumps."""

from __future__ import annotations

from typing import Any


def entry(seq: int, op: str = "all_reduce", sizes: Any = ((3, 4),), dtype: str = "Float",
          pg: tuple[str, str] = ("0", "default_pg"), backend: str = "gloo") -> dict[str, Any]:
    return {"collective_seq_id": seq, "profiling_name": f"{backend}:{op}", "pg_id": int(pg[0]),
            "process_group": list(pg), "input_sizes": [list(s) for s in sizes],
            "input_dtypes": [dtype], "is_p2p": False, "state": "scheduled", "retired": False}


def dump(entries: list[dict[str, Any]], enq: int | None = None, done: int | None = None,
         cfg_name: str = "", world: int = 2) -> dict[str, Any]:
    ranks = "[" + ", ".join(map(str, range(world))) + "]"
    d: dict[str, Any] = {"version": "2.10", "entries": entries,
                         "pg_config": {cfg_name: {"name": cfg_name, "desc": cfg_name,
                                                  "ranks": ranks}}}
    if enq is not None:  # gloo writes the numbers as strings
        d["pg_status"] = {"0": {"last_enqueued_collective": str(enq),
                                "last_started_collective": "-1",
                                "last_completed_collective": str(done if done else -1)}}
    return d
