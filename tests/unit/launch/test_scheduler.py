"""The scheduler's context of a launch (pure): KillWait from scontrol or slurm.conf, the job's
TimeLimit, the pod's grace; a value nothing says is unknown, not the scheduler's default."""

from __future__ import annotations

import pytest

from faultwatch.launch import scheduler
from faultwatch.launch.model import DEFAULT, SCHEDULER, UNKNOWN

SHOW_CONFIG = """Configuration data as of 2026-12-07T18:00:00
JobCompType             = jobcomp/none
KillWait                = 5 sec
KillOnBadExit           = 0
"""
SHOW_JOB = "JobId=81 JobName=train\n   RunTime=00:00:03 TimeLimit=1-02:00:00 TimeMin=N/A\n"


def test_kill_wait_from_scontrol_show_config() -> None:
    s = scheduler.slurm({"SLURM_JOB_ID": "81"}, SHOW_CONFIG, SHOW_JOB)
    kw = s.get("slurm.kill_wait_s")
    assert kw is not None and (kw.value, kw.origin) == (5, SCHEDULER)
    tl = s.get("slurm.time_limit_s")
    assert tl is not None and tl.value == 26 * 3600
    assert s.identity == "slurm job 81"


@pytest.mark.parametrize(("conf", "value", "origin"), [
    ("ClusterName=c\nKillWait=45\n", 45, SCHEDULER),
    ("ClusterName=c\nkillwait=12 # comment\n", 12, SCHEDULER),
    ("ClusterName=c\n", 30, DEFAULT),  # not set: slurm.conf(5)'s documented 30 s
    ("ClusterName=c\nInclude /etc/slurm/timers.conf\n", None, UNKNOWN),  # may be there
    ("KillWait=soon\n", None, UNKNOWN),
])
def test_kill_wait_from_slurm_conf(conf: str, value: int | None, origin: str) -> None:
    kw = scheduler.slurm({"SLURM_JOB_ID": "1"}, None, None, conf, "/etc/slurm/slurm.conf") \
        .get("slurm.kill_wait_s")
    assert kw is not None and (kw.value, kw.origin) == (value, origin), kw


def test_nothing_readable_is_unknown() -> None:
    kw = scheduler.slurm({"SLURM_JOB_ID": "1"}).get("slurm.kill_wait_s")
    assert kw is not None and kw.origin == UNKNOWN


@pytest.mark.parametrize(("text", "seconds"), [
    ("60", 3600), ("10:30", 630), ("01:02:03", 3723), ("2-00:00:00", 172800), ("1-12", 129600),
    ("UNLIMITED", None), ("Partition_Limit", None)])
def test_slurm_times(text: str, seconds: float | None) -> None:
    assert scheduler.slurm_time_s(text) == seconds


def test_kubernetes_grace_only_when_the_pod_spec_passes_it() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "FAULTWATCH_K8S_POD": "train-0",
           "FAULTWATCH_K8S_NAMESPACE": "ml"}
    assert scheduler.detect(env) == "kubernetes"
    s = scheduler.kubernetes(env)
    g = s.get("k8s.termination_grace_s")
    assert g is not None and g.origin == UNKNOWN and "downward API" in g.where
    assert s.identity == "pod ml/train-0"
    g = scheduler.kubernetes({**env, scheduler.K8S_GRACE_ENV: "120"}) \
        .get("k8s.termination_grace_s")
    assert g is not None and g.value == 120
    assert scheduler.detect({"SLURM_JOB_ID": "3", **env}) == "slurm"
    assert scheduler.detect({}) == "none"
