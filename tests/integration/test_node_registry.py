"""The job stage and the node registry on the real broker (issue 10): a node quarantined with
`faultwatch nodes quarantine` turns a job starting on it away within seconds (a job on a
healthy node in the same run gets nothing), and the job stage's own hardware blacklist shows
up in `faultwatch nodes --json` as a quarantine with a strike and its reason."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import pytest

from faultwatch.agents.config import EXIT_BLACKLISTED
from faultwatch.registry.gate import QUARANTINED_RULE
from tests.support.cluster import (
    decisions,
    fw_ok,
    node_records,
    processor,
    wait_decisions,
    wait_event,
    wait_processed,
)
from tests.support.processes import faultwatch_exe, job_env
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

STEPS = "import time\nfor i in range({n}):\n    print('step', i, flush=True)\n    time.sleep(0.5)\n"
XID = ("import time\nprint('NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.',"
       " flush=True)\ntime.sleep(60)\n")


def _agent(bootstrap: str, prefix: str, tmp: Path, job: str, node: str,
           code: str) -> subprocess.Popen[str]:
    import sys

    return subprocess.Popen(
        [faultwatch_exe(), "agent", "--bootstrap", bootstrap, "--topic-prefix", prefix,
         "--job", job, "--node", node, "--run-id", f"run-{job}", "--heartbeat-s", "1",
         "--spool-dir", str(tmp / node), "--follow-decisions", "--decision-wait-s", "30",
         "--", sys.executable, "-c", code],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=job_env())


def test_quarantined_node_is_turned_away_and_hardware_blacklists_quarantine(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:6]
    bad, good, xid = f"bad-{tag}", f"good-{tag}", f"xid-{tag}"
    on_bad, on_good, on_xid = f"on-bad-{tag}", f"on-good-{tag}", f"on-xid-{tag}"
    log = tmp_path / "processor.log"
    with processor(kafka_bootstrap, topic_prefix, log, "--settle-s", "1") as proc:
        wait_event(log, "partitions_assigned", 90, lambda e: e.get("partitions") != "-",
                   proc=proc)
        wait_event(log, "registry_loaded", 60, proc=proc)
        fw_ok(kafka_bootstrap, topic_prefix, "nodes", "quarantine", bad, "--for", "1h",
            "--reason", "ECC errors seen by hand")
        # the worker follows the registry live: it has the quarantine before any job starts
        wait_event(log, "registry_node", 30, lambda e: e.get("node") == bad
                   and e.get("state") == "quarantined", proc=proc)
        t0 = time.monotonic()
        agents = {on_bad: _agent(kafka_bootstrap, topic_prefix, tmp_path, on_bad, bad,
                                 STEPS.format(n=120)),
                  on_good: _agent(kafka_bootstrap, topic_prefix, tmp_path, on_good, good,
                                  STEPS.format(n=16)),
                  on_xid: _agent(kafka_bootstrap, topic_prefix, tmp_path, on_xid, xid, XID)}
        try:
            res = {job: a.communicate(timeout=120) for job, a in agents.items()}
        finally:
            for a in agents.values():
                if a.poll() is None:
                    a.kill()
        took_s = time.monotonic() - t0
        for job, (out, err) in res.items():
            (tmp_path / f"{job}.log").write_text(out + err)
        codes = {job: a.returncode for job, a in agents.items()}
        assert codes == {on_bad: EXIT_BLACKLISTED, on_good: 0, on_xid: EXIT_BLACKLISTED}, \
            {job: err[-2000:] for job, (_, err) in res.items()}
        # the job on the quarantined node was turned away long before its 60 s of work
        assert took_s < 45 and res[on_bad][0].count("step") < 60, res[on_bad][0]
        bad_decs = wait_decisions(kafka_bootstrap, topic_prefix, on_bad, 1)
        assert [(d["action"], d["targets"]["nodes"], d["reason"]["rule"]) for d in bad_decs] \
            == [("blacklist", [bad], QUARANTINED_RULE)], bad_decs
        line = bad_decs[0]["evidence"]["first_error"]["line"]
        assert f"node {bad} is quarantined until" in line and "ECC errors seen by hand" in line
        # the job stage's own hardware blacklist is in the registry: quarantined, one strike
        reg = wait_until(lambda: node_records(kafka_bootstrap, topic_prefix), 30,
                         f"node {xid} quarantined in the registry", interval_s=0.5,
                         until=lambda r: r.get(xid, {}).get("state") == "quarantined")
        xid_dec = decisions(kafka_bootstrap, topic_prefix, on_xid)[0]
        assert xid_dec["action"] == "blacklist" and xid_dec["targets"]["nodes"] == [xid]
        n = reg[xid]
        assert n["strikes"] == 1 and n["until"] > time.time() + 60
        assert [(r["event"], r["decision"], r["rule"], r["job"]) for r in n["reasons"]] == \
            [("quarantine", xid_dec["id"], xid_dec["reason"]["rule"], on_xid)]
        assert "Xid" in n["reasons"][0]["line"]
        # turning a job away adds a reason to the quarantined node, not a strike
        assert reg[bad]["strikes"] == 1 and bad_decs[0]["id"] in \
            [r["decision"] for r in reg[bad]["reasons"]]
        # positive control for "nothing": every record of the healthy job was processed
        wait_processed(kafka_bootstrap, topic_prefix)
        assert decisions(kafka_bootstrap, topic_prefix, on_good) == []
        assert good not in reg
        assert proc.poll() is None, log.read_text()[-3000:]


def test_releasing_a_node_never_seen_writes_nothing_unless_forced(
        kafka_bootstrap: str, topic_prefix: str) -> None:
    """`nodes release gpu-99` (issue 36 item 7): a typo or a node the registry never held is
    exit 7 naming the close ones, and no record is written; `--force` writes it."""
    from faultwatch.errors import EXIT_NOT_FOUND

    tag = uuid.uuid4().hex[:6]
    known = f"gpu-{tag}-17"
    fw_ok(kafka_bootstrap, topic_prefix, "nodes", "quarantine", known, "--for", "1h",
          "--reason", "ECC errors seen by hand")
    typo = f"gpu-{tag}-71"
    res = subprocess.run([faultwatch_exe(), "nodes", "release", typo, "--bootstrap",
                          kafka_bootstrap, "--topic-prefix", topic_prefix],
                         capture_output=True, text=True, timeout=60, env=job_env())
    assert res.returncode == EXIT_NOT_FOUND, (res.returncode, res.stderr)
    assert f"node '{typo}' is not in the registry" in res.stderr
    assert f"did you mean '{known}'" in res.stderr and res.stdout == ""
    assert set(node_records(kafka_bootstrap, topic_prefix)) == {known}  # nothing written
    fw_ok(kafka_bootstrap, topic_prefix, "nodes", "release", known)  # positive control
    assert node_records(kafka_bootstrap, topic_prefix)[known]["state"] == "healthy"
    fw_ok(kafka_bootstrap, topic_prefix, "nodes", "release", typo, "--force")
    assert set(node_records(kafka_bootstrap, topic_prefix)) == {known, typo}
