"""The timeout chain (pure): the rows in the order they fire with their sources, and each
nesting rule broken, nesting and unknown."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from faultwatch.core.chain import BROKEN, NOTE, OK, UNKNOWN, Chain, Faultwatch, Inputs, fmt_s
from faultwatch.core.chain_rules import build
from faultwatch.core.learned import Learned, Skew
from faultwatch.core.policy import Policy
from faultwatch.launch import parse
from faultwatch.launch.model import FLAG, Setting
from faultwatch.launch.scheduler import Scheduler, kubernetes, slurm

TWO_NODES = ["torchrun", "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1",
             "t.py"]


def chain(argv: list[str] = TWO_NODES, env: Mapping[str, str] | None = None, *,
          policy: Policy | None = None, origins: Mapping[str, str] | None = None,
          agent: Mapping[str, float] | None = None, sched: Scheduler | None = None,
          learned: Learned | None = None) -> Chain:
    a = {k: Setting(k, v, FLAG, "--" + k.split(".")[1].replace("_", "-"))
         for k, v in (agent or {}).items()}
    fw = Faultwatch(policy or Policy(), dict(origins or {}), a, "9.9")
    return build(Inputs(parse(argv, dict(env or {})), fw, sched or Scheduler(),
                        learned or Learned()))


def link(ch: Chain, lid: str) -> tuple[str, str]:
    found = [lk for lk in ch.links if lk.id == lid]
    assert len(found) == 1, [lk.id for lk in ch.links]
    return found[0].status, found[0].says + " | " + found[0].consequence + " | " + found[0].fix


def learned(*spreads: float, runs: int = 5) -> Learned:
    return Learned(available=True, why="", runs=tuple(f"r{i}" for i in range(runs)),
                   skews=tuple(Skew(f"r{i}", 0, s) for i, s in enumerate(spreads)))


def test_timers_fire_in_order_with_their_sources() -> None:
    ch = chain(origins={"hang_ceiling_s": "flags"}, policy=Policy(hang_ceiling_s=900.0))
    phases = [t.phase for t in ch.timers]
    assert phases == sorted(phases, key=["start", "hang", "failure", "stop"].index)
    for phase in ("start", "hang", "stop"):
        vals = [t.setting.seconds for t in ch.timers if t.phase == phase]
        known = [v for v in vals if v is not None]
        assert known == sorted(known) and vals[:len(known)] == known, (phase, vals)
    rows = {t.name: t.setting.source() for t in ch.timers}
    assert rows["rendezvous deadline (c10d)"].startswith("default of torch 2.15.0")
    assert rows["hang window, first attempt"] == "flag --hang-ceiling-s"
    assert rows["settle"] == "default of faultwatch 9.9 core/policy.py"
    assert rows["start skew between nodes"].startswith("unknown: not read: no --bootstrap")


def test_the_first_link_nests_by_default_for_every_backend() -> None:
    for argv in (TWO_NODES, ["torchrun", "--nnodes", "2", "t.py"],
                 [*TWO_NODES[:-1], "--rdzv-conf", "join_timeout=3600", "t.py"]):
        status, text = link(chain(argv), "start-window")
        assert status == OK, text
        assert "the command's rendezvous deadline + 30 s" in text


def test_the_first_link_breaks_when_the_deadline_is_only_in_the_environment() -> None:
    status, text = link(chain(env={"PET_RDZV_CONF": "join_timeout=1800"}), "start-window")
    assert status == BROKEN
    assert "10.5 min" in text and "30 min" in text and "not the environment" in text
    assert "--init-window-s above 30.5 min" in text
    # the user's init window covers it
    status, _ = link(chain(env={"PET_RDZV_CONF": "join_timeout=1800"},
                           policy=Policy(init_window_s=2000.0)), "start-window")
    assert status == OK


def test_the_first_link_for_one_node_and_for_unknown_launchers() -> None:
    assert link(chain(["torchrun", "--standalone", "t.py"]), "start-window")[0] == OK
    assert link(chain(["mpirun", "python", "t.py"]), "start-window")[0] == UNKNOWN
    assert link(chain(policy=Policy(hang_detection=False),
                      env={"PET_RDZV_CONF": "join_timeout=1800"}), "start-window")[0] == OK


def test_start_skew_against_the_rendezvous() -> None:
    # the example: join_timeout 600 s < a start skew of 14 min
    status, text = link(chain(learned=learned(120.0, 840.0)), "start-skew")
    assert status == BROKEN
    assert "rendezvous deadline 10 min vs start skew 14 min" in text
    assert "Socket Timeout" in text and "--wait-for-nodes" in text
    assert link(chain(learned=learned(300.0)), "start-skew")[0] == OK
    assert link(chain(), "start-skew")[0] == UNKNOWN  # nothing read
    nothing = Learned(available=True, why="", runs=("r1",))
    assert link(chain(learned=nothing), "start-skew")[0] == UNKNOWN  # below the notice
    # the gate absorbs the skew, unless it gives up first
    gated = chain(learned=learned(840.0), agent={"agent.wait_for_nodes": 2})
    assert link(gated, "start-skew")[0] == OK
    short = chain(learned=learned(840.0), agent={"agent.wait_for_nodes": 2,
                                                 "agent.wait_for_nodes_timeout_s": 600.0})
    assert link(short, "start-skew")[0] == BROKEN


def test_probes_before_torch_tears_the_ranks_down() -> None:
    assert link(chain(), "probes-vs-pg.timeout_s.nccl")[0] == OK
    short = chain([*TWO_NODES, "--distributed-timeout-minutes", "4"])
    status, text = link(short, "probes-vs-pg.timeout_s.nccl")
    assert status == BROKEN and "stack probes at 5 min >= the NCCL collective timeout 4 min" \
        in text
    hb = chain(env={"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "200"})
    assert link(hb, "probes-vs-nccl.heartbeat_timeout_s")[0] == BROKEN
    off = chain(env={"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "200",
                     "TORCH_NCCL_ENABLE_MONITORING": "0"})
    assert all(lk.id != "probes-vs-nccl.heartbeat_timeout_s" for lk in off.links)
    assert link(chain(["mpirun", "t.py"]), "probes-vs-pg.timeout_s.nccl")[0] == UNKNOWN


def test_agent_stop_against_the_schedulers_grace() -> None:
    kw5 = slurm({"SLURM_JOB_ID": "7"}, "KillWait = 5 sec\n")
    status, text = link(chain(sched=kw5), "agent-vs-scheduler")
    assert status == BROKEN
    assert "agent stop 20 s" in text and "KillWait 5 s" in text and "spool" in text
    fits = chain(sched=kw5, agent={"agent.term_grace_s": 1.0,
                                   "agent.exit_flush_timeout_s": 2.0})
    assert link(fits, "agent-vs-scheduler")[0] == OK
    assert link(chain(sched=kubernetes({"FAULTWATCH_K8S_POD": "p"})),
                "agent-vs-scheduler")[0] == UNKNOWN
    assert all(lk.id != "agent-vs-scheduler" for lk in chain().links)  # no scheduler


def test_worker_shutdown_and_save_on_sigterm() -> None:
    assert link(chain(), "worker-stop")[0] == NOTE  # torch's default 30 s > 10 s
    explicit = chain([*TWO_NODES[:-1], "--shutdown-timeout", "60", "t.py"])
    assert link(explicit, "worker-stop")[0] == BROKEN
    fits = chain([*TWO_NODES[:-1], "--shutdown-timeout", "5", "t.py"])
    assert link(fits, "worker-stop")[0] == OK
    megatron = [*TWO_NODES, "--exit-signal-handler", "--save-interval", "500"]
    assert link(chain(megatron), "save-on-sigterm")[0] == UNKNOWN  # a save's length: unknown
    saves = Learned(available=True, why="", runs=("r",), checkpoint_silences_s=(45.0,))
    assert link(chain(megatron, learned=saves), "save-on-sigterm")[0] == BROKEN
    assert link(chain(megatron, learned=saves, agent={"agent.term_grace_s": 90.0}),
                "save-on-sigterm")[0] == OK
    assert link(chain(megatron), "window-vs-checkpoint")[0] == UNKNOWN


def test_the_agents_own_links() -> None:
    assert link(chain(), "decision-wait")[0] == OK
    assert link(chain(agent={"agent.decision_wait_s": 4.0}), "decision-wait")[0] == BROKEN
    assert link(chain(), "heartbeats")[0] == OK
    assert link(chain(agent={"agent.heartbeat_flowing_s": 20.0}), "heartbeats")[0] == BROKEN


def test_no_backstop_and_two_restarters() -> None:
    env = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}
    assert link(chain(env=env), "backstop")[0] == NOTE
    assert link(chain(env=env, policy=Policy(hang_detection=False)), "backstop")[0] == BROKEN
    assert all(lk.id != "backstop" for lk in chain().links)
    assert link(chain([*TWO_NODES[:-1], "--max-restarts", "3", "t.py"]),
                "two-restarters")[0] == NOTE


def test_a_clean_chain_has_no_broken_link() -> None:
    ch = chain([*TWO_NODES[:-1], "--shutdown-timeout", "5",
                "--rdzv-conf", "join_timeout=900", "t.py"],
               sched=slurm({"SLURM_JOB_ID": "1"}, "KillWait = 60 sec\n"),
               learned=learned(30.0))
    assert ch.nests and ch.broken == ()
    assert {lk.status for lk in ch.links} <= {OK, NOTE}
    d = ch.to_dict()
    assert d["nests"] is True and d["broken"] == 0 and d["timers"] and d["links"]


@pytest.mark.parametrize(("s", "text"), [(None, "unknown"), (45.0, "45 s"), (600.0, "10 min"),
                                         (630.0, "10.5 min"), (7200.0, "2 h"),
                                         (0.1, "0.1 s")])
def test_fmt_s(s: float | None, text: str) -> None:
    assert fmt_s(s) == text
