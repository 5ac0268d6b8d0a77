"""Hot spares end to end: a real two-node torchrun job (gloo, c10d rendezvous) under four agents
with distinct node names (n1, n2 active; n3, n4 spares), a real processor and broker.

n3 fails its boot check (its scratch path is a file), so it is never swapped in although it
registered first; n2 prints an NVIDIA Xid 79 line and hangs. The processor blacklists n2 and
swaps in n4: n2's agent leaves (replaced, exit 0), n1 relaunches, n4 joins, the job resumes
from its last checkpoint and finishes; n3 is released when the run is done. Nothing requeues.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import decisions, processor, wait_log, wait_processor_ready
from tests.support.spares import SpareJob

pytestmark = [pytest.mark.slow, pytest.mark.kafka]


@pytest.fixture(scope="module")
def cluster(kafka_bootstrap: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    prefix = f"spare{uuid.uuid4().hex[:8]}."
    log = tmp_path_factory.mktemp("proc") / "processor.log"
    with processor(kafka_bootstrap, prefix, log, "--settle-s", "1", "--max-restarts", "3",
                   "--hang-window-s", "60") as proc:
        wait_processor_ready(kafka_bootstrap, prefix, proc, log)
        yield kafka_bootstrap, prefix
        assert proc.poll() is None, f"processor died:\n{log.read_text()[-4000:]}"


def test_an_xid_node_is_replaced_by_a_checked_spare_and_training_resumes(
        cluster: tuple[str, str], tmp_path: Path) -> None:
    bootstrap, prefix = cluster
    job = f"spares-{uuid.uuid4().hex[:6]}"
    run = SpareJob(bootstrap, prefix, job, tmp_path, total=4, spares=2,
                   fault_env={"FW_XID_NODE": "n2", "FW_XID_STEP": "4", "FW_STEPS": "10",
                              "FW_STEP_S": "0.3"})
    bad_path = tmp_path / "not-a-dir"
    bad_path.write_text("x")
    try:
        # n3 registers first (its first note precedes its checks), and its check fails: only
        # the check keeps it out (the longest waiting spare is chosen first)
        run.start("n3", 2, "--bootcheck", "--bootcheck-path", str(bad_path),
                  "--no-bootcheck-allreduce")
        wait_log(run.log("n3"), "event=spare_waiting", 60)
        for node, index in (("n4", 3), ("n1", 0), ("n2", 1)):
            run.start(node, index)
        codes = run.wait_all(240)
    finally:
        run.stop()
    decs = decisions(bootstrap, prefix, job)
    assert [(d["action"], d["reason"]["kind"], d["targets"]["nodes"]) for d in decs] == [
        ("notify", "bootcheck", ["n3"]), ("blacklist", "error", ["n2"])], decs
    d = decs[1]
    assert d["swaps"] == [{"node": "n2", "spare": "n4"}], d
    assert d["evidence"]["restart_nodes"] == ["n1", "n4"]
    assert d["evidence"]["spares"]["spares"]["n3"]["why_not"].startswith(
        "boot checks failed: disk"), d["evidence"]["spares"]
    assert codes == {"n1": 0, "n2": 0, "n3": 0, "n4": 0}, run.tails()
    verdicts = {n: run.verdict(n)["verdict"] for n in codes}
    assert verdicts == {"n1": "success", "n2": "replaced", "n3": "released", "n4": "success"}
    assert run.verdict("n4")["attempt"] == 1
    assert "event=bootcheck_failed node=n3 check=disk:" in run.log("n3").read_text()
    # the new attempt ran on n1 and n4 from the last checkpoint to the end
    steps = run.steps()
    before = [s for s in steps if s["attempt"] == 0]
    after = [s for s in steps if s["attempt"] == 1]
    assert {s["node"] for s in before} == {"n1", "n2"} and max(s["step"] for s in before) == 3
    assert {s["node"] for s in after} == {"n1", "n4"}
    assert {s["resumed_from"] for s in after} == {4}  # nothing redone, nothing skipped
    assert sorted({s["step"] for s in after}) == list(range(4, 10))
    # the decision came before the first step after the swap
    assert min(s["t"] for s in after) > d["ts"]
