"""The agent side of hot spares: roles from the allocation, the rendezvous host, what a decision
means for a replaced node and a spare, the node lock, the run's end, and the wire contract."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from faultwatch import wire
from faultwatch.agents.decisions import BLACKLISTED, REPLACED, RESTART, verdict
from faultwatch.agents.roles import hosts_rendezvous, rendezvous_endpoint, role_of
from faultwatch.agents.spare import NodeLock, next_nodes, run_done, swapped_in
from faultwatch.core.events import Decision
from faultwatch.errors import ConfigError, DecodeError


def _dec(action: str = "blacklist", nodes: tuple[str, ...] = ("n2",), attempt: int = 0,
         swaps: tuple[tuple[str, str], ...] = (("n2", "n4"),), **ev: object) -> Decision:
    evidence = {"restart_nodes": ["n1", "n4"], **ev} if action == "blacklist" else dict(ev)
    return Decision(id="d1", job="j", attempt=attempt, action=action, kind="error", ts=1.0,
                    nodes=nodes, evidence=evidence, swaps=swaps, run_id="r")


# ---- roles ---------------------------------------------------------------------------------

def test_the_last_k_nodes_of_the_allocation_are_spares() -> None:
    slurm = {"SLURM_NODEID": "2", "SLURM_STEP_NUM_NODES": "3", "SLURM_JOB_NUM_NODES": "9"}
    assert role_of(False, 1, slurm).spare is True
    assert role_of(False, 1, {**slurm, "SLURM_NODEID": "1"}).spare is False
    assert role_of(False, 1, {**slurm, "SLURM_NODEID": "0"}).spare is False  # node 0: active
    assert role_of(False, 0, slurm).spare is False  # no --spares: active whatever the place
    k8s = {"JOB_COMPLETION_INDEX": "3", "FAULTWATCH_NODES_TOTAL": "4"}
    assert role_of(False, 1, k8s).spare is True
    assert role_of(False, 1, {}, node_index=1, nodes_total=4).spare is False
    assert role_of(True, 0, {}).spare is True  # --spare whatever the place
    # the flags win over the scheduler's environment
    assert role_of(False, 1, slurm, node_index=0, nodes_total=3).spare is False


@pytest.mark.parametrize("env,kw,why", [
    ({}, {}, "needs this node's place"),
    ({"JOB_COMPLETION_INDEX": "1"}, {}, "needs this node's place"),
    ({"SLURM_NODEID": "3", "SLURM_STEP_NUM_NODES": "3"}, {}, "outside 0..2"),
    ({"SLURM_NODEID": "x", "SLURM_STEP_NUM_NODES": "3"}, {}, "not an integer"),
    ({}, {"node_index": 0, "nodes_total": 2, "spares": 2}, "leave no active node"),
])
def test_a_place_that_cannot_be_known_is_a_clear_error(env: dict[str, str],
                                                       kw: dict[str, int], why: str) -> None:
    spares = kw.pop("spares", 1)
    with pytest.raises(ConfigError, match=why):
        role_of(False, spares, env, **kw)


def test_the_rendezvous_endpoint_of_a_launch_line() -> None:
    tr = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--rdzv-backend",
          "c10d", "--rdzv-endpoint", "node0:29400", "train.py", "--rdzv-endpoint", "x:1"]
    assert rendezvous_endpoint(tr, {}) == "node0:29400"  # not the script's own flag
    assert rendezvous_endpoint(["torchrun", "--rdzv_endpoint=h:1", "t.py"], {}) == "h:1"
    assert rendezvous_endpoint(["torchrun", "--standalone", "--rdzv-endpoint=h:1", "t.py"],
                               {}) is None  # torchrun itself ignores it: localhost:0
    assert rendezvous_endpoint(["torchrun", "t.py"], {"PET_RDZV_ENDPOINT": "e:2"}) == "e:2"
    assert rendezvous_endpoint(["torchrun", "--master-addr", "m", "t.py"], {}) == "m"
    assert rendezvous_endpoint(["bash", "-c", "torchrun --rdzv-endpoint=b:3 t.py"], {}) == "b:3"
    assert rendezvous_endpoint(["python", "train.py"], {"MASTER_ADDR": "m"}) is None


def test_who_hosts_the_rendezvous() -> None:
    names = ("node0", "node0.cluster")
    ours = ["10.0.0.5", "fe80::1", "node0.cluster.example"]

    def hosts(endpoint: str | None, theirs: tuple[str, ...] = (),
              mine: tuple[str, ...] = names) -> bool | None:
        return hosts_rendezvous(endpoint, mine, ours, theirs)

    assert hosts("node0:29400") is True
    assert hosts("NODE0.cluster:29400") is True
    assert hosts("node0.cluster.example:29400") is True  # a canonical name of ours
    assert hosts("10.0.0.5:29400") is True
    assert hosts("[fe80::1]:29400") is True
    # a name that resolves to one of our addresses (a pod's DNS name through its Service)
    assert hosts("train-0.train:29400", theirs=("10.0.0.5",)) is True
    assert hosts("train-1.train:29400", theirs=("10.0.0.6",)) is False
    assert hosts("node0:29400", mine=("node1",)) is False
    for loop in ("127.0.0.1:29400", "localhost:1", "[::1]:5"):  # every node of a test: unknown
        assert hosts(loop) is None, loop
    assert hosts(None) is None


# ---- decisions -------------------------------------------------------------------------------

def test_a_replaced_node_leaves_and_the_others_restart() -> None:
    d = _dec()
    assert verdict(d, "n2", 0) == REPLACED  # named by the blacklist too: it leaves, no 138
    assert verdict(d, "n1", 0) == RESTART
    assert verdict(d, "n2", 1) is None  # another attempt's decision
    assert verdict(_dec(swaps=()), "n2", 0) == BLACKLISTED  # positive control: no swap
    lost = _dec("restart", nodes=("n1", "n4"), swaps=(("n2", "n4"),))
    assert verdict(lost, "n2", 0) == REPLACED  # a lost node that returns leaves too
    assert swapped_in(d, "n4") == "n2" and swapped_in(d, "n1") is None
    assert swapped_in(_dec("fail", nodes=(), swaps=()), "n4") is None
    assert next_nodes(d) == 2 and next_nodes(lost) == 2


# ---- the node lock ---------------------------------------------------------------------------

def test_one_spare_per_node_across_processes(tmp_path: Path) -> None:
    """A spare that joined holds its node's lock: another job's spare on the node sees who
    (busy), cannot take it (declines), and can once the holder is gone."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]);"
         "from faultwatch.agents.spare import NodeLock;"
         "assert NodeLock('n4', sys.argv[2]).acquire('job a run r1');"
         "print('held', flush=True); time.sleep(60)",
         str(Path(__file__).resolve().parents[3]), str(tmp_path)],
        stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        other = NodeLock("n4", str(tmp_path))
        assert other.holder() == "job a run r1"
        assert other.acquire("job b") is False
        free = NodeLock("n5", str(tmp_path))  # positive control: another node is free
        assert free.holder() == "" and free.acquire("job b") is True
    finally:
        holder.kill()
        holder.wait()
    assert other.holder() == "" and other.acquire("job b") is True
    assert other.holder() == ""  # our own lock is no one else's


def test_the_run_is_done_only_for_its_own_run() -> None:
    snap = {"job": "j", "run_id": "r1", "attempt": 1, "phase": "done", "ts": time.time()}
    assert run_done(wire.encode_status(snap), "j", "r1")
    assert not run_done(wire.encode_status({**snap, "phase": "running"}), "j", "r1")
    assert not run_done(wire.encode_status({**snap, "run_id": "r0"}), "j", "r1")
    assert not run_done(b"not json", "j", "r1")


# ---- the wire contract -----------------------------------------------------------------------

def test_swaps_round_trip_and_what_the_decoder_refuses() -> None:
    d = _dec()
    rec = wire.decision_to_dict(d)
    assert rec["swaps"] == [{"node": "n2", "spare": "n4"}]
    assert wire.decode_decision(wire.encode_decision(d)) == d
    assert "swaps" not in wire.decision_to_dict(_dec(swaps=()))  # absent: no swap

    def bad(**over: object) -> None:
        with pytest.raises(DecodeError, match="swaps"):
            wire.decode_decision(orjson.dumps({**rec, **over}))

    bad(action="notify")  # only a restart or blacklist swaps
    bad(swaps=[{"node": "n2", "spare": "n2"}])  # a node replaced by itself
    bad(swaps=[{"node": "n2", "spare": "n4"}, {"node": "n3", "spare": "n4"}])  # one spare twice
    bad(swaps=[{"node": "n2"}])
    bad(swaps={"node": "n2", "spare": "n4"})
    bad(swaps=[{"node": "n2\n", "spare": "n4"}])


def test_a_spare_needs_decisions_and_the_runs_shared_id(tmp_path: Path) -> None:
    from faultwatch.agents.agent import Agent
    from faultwatch.agents.config import AgentConfig
    from faultwatch.agents.transport import Transport

    class Quiet:  # no Kafka: the checks run before anything is sent
        decisions = control = None

        def on_gap(self, _: object) -> None: ...

        def submit(self, *_: object, **__: object) -> None: ...

    def agent(**kw: object) -> Agent:
        cfg = AgentConfig(bootstrap="x:1", job="j", node="n3", cmd=("sleep", "1"), rank=0,
                          spool_dir=tmp_path, spare=True, env=dict(os.environ), **kw)
        q: Transport = Quiet()  # type: ignore[assignment]
        return Agent(cfg, q)

    with pytest.raises(ConfigError, match="follows the job's decisions"):
        agent(follow_decisions=False, run_id="r1", run_source="flag")
    with pytest.raises(ConfigError, match="shared id"):
        agent(follow_decisions=True)  # a generated id
    assert agent(follow_decisions=True, run_id="r1", run_source="flag").role.spare
