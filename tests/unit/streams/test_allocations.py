"""The processor's allocation questions (streams/allocations.py): what a batch asks, how long
an answer is kept, what an unanswerable or malformed question gives, and the job stage
refusing a node the answer does not list (issue 35 item 1)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import orjson
import pytest

from faultwatch import wire
from faultwatch.core.events import Exit, Heartbeat, Hit, Match, RunStart
from faultwatch.core.policy import Policy
from faultwatch.errors import ConfigError
from faultwatch.rules import Matcher, load_ruleset
from faultwatch.streams.allocations import (
    ANSWER_TTL_S,
    REFRESH_S,
    RETRY_S,
    Allocations,
    exec_asker,
    parse_exec,
    parse_key,
)
from faultwatch.streams.job_stage import DictStore, JobStage
from faultwatch.streams.records import InRecord, LiveRules
from faultwatch.trust.refusals import REFUSALS

SLURM = {"kind": "slurm", "job_id": "77"}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_answers_are_kept_refreshed_for_a_new_node_and_retried_after_a_failure() -> None:
    asked: list[str] = []
    answer = {"slurm:1": frozenset({"a"})}

    def ask(key: str) -> frozenset[str]:
        asked.append(key)
        if key == "slurm:bad":
            raise OSError("slurmctld unreachable")
        return answer[key]

    clock = Clock()
    alloc = Allocations(ask, "slurm", clock=clock)
    got = asyncio.run(alloc.for_batch([("slurm:1", "a"), ("slurm:bad", "a")]))
    assert got == {"slurm:1": frozenset({"a"})} and alloc.failed == 1
    asyncio.run(alloc.for_batch([("slurm:1", "a"), ("slurm:bad", "a")]))
    assert asked == ["slurm:1", "slurm:bad"]  # kept; the failure is not asked again at once
    clock.t += REFRESH_S
    answer["slurm:1"] = frozenset({"a", "b"})
    got = asyncio.run(alloc.for_batch([("slurm:1", "b")]))  # a node the answer lacks
    assert got == {"slurm:1": frozenset({"a", "b"})} and asked[-1] == "slurm:1"
    clock.t += RETRY_S
    asyncio.run(alloc.for_batch([("slurm:bad", "a")]))
    assert asked.count("slurm:bad") == 2
    clock.t += ANSWER_TTL_S
    asyncio.run(alloc.for_batch([("slurm:1", "a")]))
    assert asked.count("slurm:1") == 3
    assert asyncio.run(alloc.for_batch([])) == {}


def test_a_failure_keeps_the_last_answer() -> None:
    calls = {"n": 0}

    def ask(key: str) -> frozenset[str]:
        calls["n"] += 1
        if calls["n"] > 1:
            raise TimeoutError
        return frozenset({"a"})

    clock = Clock()
    alloc = Allocations(ask, "slurm", clock=clock)
    asyncio.run(alloc.for_batch([("slurm:1", "a")]))
    clock.t += ANSWER_TTL_S
    assert asyncio.run(alloc.for_batch([("slurm:1", "a")])) == {"slurm:1": frozenset({"a"})}


def test_malformed_scheduler_names_are_no_job(tmp_path: Path) -> None:
    """The key comes from an agent's run-start: a name no scheduler accepts is answered
    `no node` without asking (never passed to a command)."""
    assert parse_key("slurm:12;rm -rf") is None
    assert parse_key("kubernetes:ML/x") is None
    assert parse_key("slurm:12") == {"kind": "slurm", "job_id": "12"}
    assert parse_key("kubernetes:ml/pod/w-0") == {"kind": "kubernetes", "namespace": "ml",
                                                  "pod": "w-0"}
    log = tmp_path / "asked"
    script = f"import sys\nopen({str(log)!r}, 'a').write(' '.join(sys.argv[1:]))\n"
    ask = exec_asker((sys.executable, "-c", script, "{job_id}"))
    assert ask("slurm:1;x") == frozenset() and not log.exists()


def test_the_exec_question_prints_the_nodes_or_exits_1(tmp_path: Path) -> None:
    table = tmp_path / "alloc"
    table.write_text("77 n1,n2\n")
    script = ("import sys\nalloc = dict(l.split() for l in open(sys.argv[1]))\n"
              "if sys.argv[2] not in alloc: sys.exit(1)\nprint(alloc[sys.argv[2]])\n")
    tpl = parse_exec(orjson.dumps([sys.executable, "-c", script, str(table),
                                   "{job_id}"]).decode())
    ask = exec_asker(tpl)
    assert ask("slurm:77") == {"n1", "n2"}
    assert ask("slurm:78") == frozenset()
    with pytest.raises(ConfigError):
        parse_exec('["x", "{node}"]')
    with pytest.raises(ConfigError):
        parse_exec('["{kind}"]')
    broken = exec_asker((sys.executable, "-c", "import sys; sys.exit(3)"))
    with pytest.raises(Exception, match="exited 3"):
        broken("slurm:77")


def _rec(offset: int, *sigs: object) -> InRecord:
    return InRecord("t.signals", 0, offset, b"victim",
                    wire.encode_bundle("victim", list(sigs)))  # type: ignore[arg-type]


def test_the_job_stage_asks_for_run_starts_and_refuses_a_node_the_answer_lacks() -> None:
    rs = load_ruleset([])
    stage = JobStage(LiveRules(Matcher(rs), Policy(settle_s=1), rs.version), DictStore(),
                     lambda rec, err: None)
    victim = RunStart("victim", 0, "nodeB", 100.0, run_id="77", run_source="slurm",
                      scheduler=SLURM)
    first = [_rec(0, victim)]
    assert stage.allocation_requests(first) == [("slurm:77", "nodeB")]
    stage.answers = {"slurm:77": frozenset({"nodeB"})}
    stage.process_batch(first, 100.0)
    # nodeA claims the run by its id (no scheduler identity of its own): the stage still
    # asks about the run it would join (its state was checked)
    m = Match("nvidia-xid-hardware", "hardware", False, 101.0, "Xid 79", None)
    attack = [_rec(1, RunStart("victim", 0, "nodeA", 101.0, run_id="77", run_source="flag"),
                   Hit("victim", 0, "nodeA", m, run_id="77"),
                   Exit("victim", 0, "nodeA", 101.5, 1, run_id="77"))]
    assert stage.allocation_requests(attack) == [("slurm:77", "nodeA")]
    before = REFUSALS[("run", "not_allocated")]
    stage.answers = {}
    decs = stage.process_batch(attack, 102.0)
    decs += stage.process_batch([_rec(2, Heartbeat("victim", 0, "nodeB", 110.0, True, 109.0,
                                                   run_id="77"))], 110.0)
    assert decs == [] and REFUSALS[("run", "not_allocated")] - before == 3
    # no job of its own either: a refused first run-start stores nothing
    other = RunStart("phantom", 0, "nodeA", 101.0, run_id="99", run_source="slurm",
                     scheduler={"kind": "slurm", "job_id": "99"})
    stage.answers = {"slurm:99": frozenset()}
    stage.process_batch([InRecord("t.signals", 0, 3, b"phantom",
                                  wire.encode_bundle("phantom", [other]))], 103.0)
    assert wire.job_key("phantom") not in stage.store.data  # type: ignore[attr-defined]
