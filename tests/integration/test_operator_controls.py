"""Issue 36 on a real broker, one secured processor (processor key, operator key, a node key for
n1 in its trust file), the real CLI and real agents:

1. a job that fails within ~200 ms (a CUDA OOM: FAIL, exit 78) and one that succeeds at once
   are listed by `status` and answer `status JOB`;
3. an unsigned (or untrusted) `rules push` and `nodes quarantine` are refused by the command
   (exit 8, nothing written); a record written around the command is refused by the processor
   and that shows in `rules show`, `status` and `faultwatch_refused_total`; an agent whose
   records are refused for want of a node key ends 77 with the reason and what to do;
5. `rules rollback` pushes the revision before again, signed; a held job's restart is a
   notice its agent does not act on while the unheld job beside it is restarted, and
   `status` and `describe` show the hold.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from faultwatch.errors import EXIT_NOT_FOUND, EXIT_REFUSED
from faultwatch.rollout.rules_push import publish_record
from faultwatch.trust.keys import generate
from faultwatch.wire.topics import Topics
from tests.support.cluster import (
    agent_cmd,
    decisions,
    processor,
    refused_metric,
    wait_event,
    wait_processor_ready,
)
from tests.support.kafka import read_topic
from tests.support.processes import faultwatch_exe, job_env
from tests.support.pushed_rules import RETRYABLE, rules_version_of
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

OOM = ("import sys\nprint('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
       "20.00 GiB. GPU 0 has a total capacity of 79.15 GiB', file=sys.stderr)\nsys.exit(1)\n")
NCCL = ("import sys\nprint('RuntimeError: NCCL error in: socket.cpp:1, unhandled system "
        "error, NCCL version 2.18.1', file=sys.stderr)\nsys.exit(1)\n")
OTHER = RETRYABLE.replace("site.flux-overheat", "site.other").replace("flux capacitor",
                                                                       "warp coil")


class Site:
    """The keys and trust file of one secured site."""

    def __init__(self, d: Path) -> None:
        self.dir = d
        lines = [generate(d / f"{name}.key", role, node).line()
                 for role, name, node in (("processor", "proc", ""), ("operator", "ops", ""),
                                          ("node", "n1", "n1"))]
        generate(d / "stranger.key", "operator", "")  # an operator key no one trusts
        (d / "trust").write_text("\n".join(lines) + "\n")

    def key(self, name: str) -> str:
        return str(self.dir / f"{name}.key")

    def env(self, **extra: str) -> dict[str, str]:
        return {**job_env(), "FAULTWATCH_TRUST_FILE": str(self.dir / "trust"), **extra}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    return Site(tmp_path_factory.mktemp("site"))


@pytest.fixture(scope="module")
def cluster(kafka_bootstrap: str, site: Site, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[str, Path]]:
    """One secured processor for the module: (prefix, its log), its trust policy announced."""
    prefix = f"ops{uuid.uuid4().hex[:8]}."
    log = tmp_path_factory.mktemp("proc") / "processor.log"
    with processor(kafka_bootstrap, prefix, log, "--settle-s", "0.5", "--metrics-port", "0",
                   env={"FAULTWATCH_TRUST_FILE": str(site.dir / "trust"),
                        "FAULTWATCH_SIGNING_KEY_FILE": site.key("proc")}) as proc:
        wait_processor_ready(kafka_bootstrap, prefix, proc, log)
        wait_until(lambda: "trust file: verifies" in cli(kafka_bootstrap, prefix, site,
                                                         "rules", "show").stdout,
                   90, "the worker's announced trust policy", interval_s=1.0)
        yield prefix, log
        assert proc.poll() is None, log.read_text()[-3000:]


def cli(bootstrap: str, prefix: str, site: Site, *args: str, key: str | None = None,
        timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """`faultwatch ARGS --bootstrap B --topic-prefix P`, with the operator's key `key` (and
    a wide terminal: tables are not cut to 80 columns)."""
    env = site.env(COLUMNS="250",
                   **({"FAULTWATCH_SIGNING_KEY_FILE": site.key(key)} if key else {}))
    return subprocess.run([faultwatch_exe(), *args, "--bootstrap", bootstrap,
                           "--topic-prefix", prefix], capture_output=True, text=True,
                          timeout=timeout, env=env)


def run_agent(bootstrap: str, prefix: str, site: Site, tmp: Path, job: str, node: str,
              code: str, *flags: str) -> subprocess.Popen[bytes]:
    keyed = ["--node-key-file", site.key(node)] if node == "n1" else []
    return subprocess.Popen(
        agent_cmd(bootstrap, prefix, job, node, [sys.executable, "-c", code],
                  "--follow-decisions", "--spool-dir", str(tmp / f"spool-{job}"), *keyed,
                  *flags),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=site.env())


def snapshots(bootstrap: str, prefix: str, site: Site) -> dict[str, dict[str, Any]]:
    out = cli(bootstrap, prefix, site, "status", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(x) for x in out.stdout.splitlines() if x.strip()]
    return {r["job"]: r for r in rows if r.get("t") == "status"}


# ---- item 1 ------------------------------------------------------------------------------

def test_jobs_that_end_at_once_are_in_status(kafka_bootstrap: str, site: Site,
                                             cluster: tuple[str, Path], tmp_path: Path) -> None:
    prefix, plog = cluster
    b = kafka_bootstrap
    crash, quick = f"oom-{uuid.uuid4().hex[:6]}", f"quick-{uuid.uuid4().hex[:6]}"
    agents = [run_agent(b, prefix, site, tmp_path, crash, "n1", OOM),
              run_agent(b, prefix, site, tmp_path, quick, "n1", "pass")]
    codes = [a.wait(120) for a in agents]
    assert codes == [78, 0], [a.stderr.read()[-2000:] for a in agents if a.stderr]
    snaps = wait_until(lambda: snapshots(b, prefix, site), 60, "both jobs in status",
                       interval_s=1.0, until=lambda s: crash in s and quick in s,
                       detail=lambda: plog.read_text()[-2000:])
    assert (snaps[crash]["phase"], snaps[crash]["nodes"][0]["exit_code"]) == ("decided", 1)
    assert len(snaps[crash]["decisions"]) == 1
    assert (snaps[quick]["phase"], snaps[quick]["nodes"][0]["exit_code"]) == ("done", 0)
    for job in (crash, quick):
        one = cli(b, prefix, site, "status", job)
        assert one.returncode == 0, one.stderr
        assert job in one.stdout
    text = cli(b, prefix, site, "status").stdout
    assert crash in text and quick in text


# ---- item 3 ------------------------------------------------------------------------------

def test_a_write_the_processors_would_refuse_is_refused_by_the_command(
        kafka_bootstrap: str, site: Site, cluster: tuple[str, Path], tmp_path: Path) -> None:
    prefix, plog = cluster
    b = kafka_bootstrap
    rules = Topics(prefix).rules
    (tmp_path / "site.yaml").write_text(RETRYABLE)
    before = len(read_topic(b, rules))
    unsigned = cli(b, prefix, site, "rules", "push", str(tmp_path / "site.yaml"))
    assert unsigned.returncode == EXIT_REFUSED, unsigned
    assert "rules push refused: 1 of 1 processor worker(s) verify rule sets" in unsigned.stderr
    assert "--signing-key-file" in unsigned.stderr and "pushed" not in unsigned.stdout
    stranger = cli(b, prefix, site, "rules", "push", str(tmp_path / "site.yaml"),
                   key="stranger")
    assert stranger.returncode == EXIT_REFUSED and "signed by key" in stranger.stderr
    node = cli(b, prefix, site, "nodes", "quarantine", "gpu-9", "--for", "1h", "--reason", "x")
    assert node.returncode == EXIT_REFUSED and "nodes quarantine refused" in node.stderr
    assert len(read_topic(b, rules)) == before  # nothing was written
    assert not [r for r in read_topic(b, Topics(prefix).nodes) if r.key == b"gpu-9"]
    # what a record written around the command meets: the processor's refusal, visible
    evil = orjson.dumps({"v": 1, "version": "evil", "pushed_at": 1.0, "builtin": True,
                         "files": [{"name": "evil.yaml", "text": OTHER}]})
    asyncio.run(publish_record(b, rules, evil))
    wait_event(plog, "rules_refused", 60)
    assert refused_metric(plog).get(("rules", "unsigned"), 0) >= 1
    shown = wait_until(lambda: cli(b, prefix, site, "rules", "show").stdout, 60,
                       "the refusal in `rules show`", interval_s=1.0,
                       until=lambda t: "rules.unsigned" in t)
    assert "last rules: unsigned" in shown and "carries no signature" in shown
    workers = [json.loads(x) for x in cli(b, prefix, site, "status", "--json").stdout
               .splitlines() if '"t":"worker"' in x]
    assert workers and workers[0]["refused"]["counts"]["rules.unsigned"] >= 1
    # positive control: the operator's signed push is written and loaded
    ok = cli(b, prefix, site, "rules", "push", str(tmp_path / "site.yaml"), key="ops")
    assert ok.returncode == 0 and "signed by key" in ok.stdout, ok.stderr
    wait_event(plog, "rules_loaded", 60,
               where=lambda e: e.get("version") == rules_version_of(ok.stdout))


def test_an_agent_without_its_node_key_is_told_why_nothing_was_decided(
        kafka_bootstrap: str, site: Site, cluster: tuple[str, Path], tmp_path: Path) -> None:
    prefix, _ = cluster
    job = f"nokey-{uuid.uuid4().hex[:6]}"
    agent = run_agent(kafka_bootstrap, prefix, site, tmp_path, job, "n2", NCCL,
                      "--decision-wait-s", "15")
    _, err = agent.communicate(timeout=180)
    text = err.decode(errors="replace")
    assert agent.returncode == 77, text[-3000:]  # the exit-code contract is unchanged
    assert "event=records_refused" in text, text[-3000:]
    closing = next(ln for ln in text.splitlines() if "verdict undecided (exit 77)" in ln)
    assert "the processors refuse this node's records (unsigned)" in closing, closing
    assert "FAULTWATCH_NODE_KEY_FILE" in closing


# ---- item 5 ------------------------------------------------------------------------------

def test_rules_rollback_pushes_the_revision_before_again_signed(
        kafka_bootstrap: str, site: Site, cluster: tuple[str, Path], tmp_path: Path) -> None:
    prefix, plog = cluster
    b = kafka_bootstrap
    (tmp_path / "a.yaml").write_text(RETRYABLE)
    (tmp_path / "b.yaml").write_text(OTHER)
    first = cli(b, prefix, site, "rules", "push", str(tmp_path / "a.yaml"), key="ops")
    second = cli(b, prefix, site, "rules", "push", str(tmp_path / "b.yaml"), key="ops")
    assert first.returncode == second.returncode == 0, (first.stderr, second.stderr)
    rev = int(second.stdout.split("as revision ")[1].split(",")[0])
    history = cli(b, prefix, site, "rules", "history")
    assert f"* {rev}  version {rules_version_of(second.stdout)}" in history.stdout
    assert f"  {rev - 1}  version {rules_version_of(first.stdout)}" in history.stdout
    refused = cli(b, prefix, site, "rules", "rollback")
    assert refused.returncode == EXIT_REFUSED and "rules rollback refused" in refused.stderr
    back = cli(b, prefix, site, "rules", "rollback", key="ops")
    assert back.returncode == 0, back.stderr
    assert f"rolled back rules to revision {rev - 1}: version " \
           f"{rules_version_of(first.stdout)}" in back.stdout
    assert f"now revision {rev + 1}, version {rules_version_of(first.stdout)}" in back.stdout
    assert f"was revision {rev}" in back.stdout and "signed by key" in back.stdout
    wait_event(plog, "rules_loaded", 60, where=lambda e: e.get("version") == rules_version_of(
        first.stdout) and e.get("push_id") not in (None, "None"))
    wait_until(lambda: cli(b, prefix, site, "rules", "show").stdout, 60,
               "the rollback in `rules show`", interval_s=1.0,
               until=lambda t: f"revision {rev + 1} (rollback of {rev})" in t)


def test_a_held_job_is_not_restarted_and_status_and_describe_say_so(
        kafka_bootstrap: str, site: Site, cluster: tuple[str, Path], tmp_path: Path) -> None:
    prefix, plog = cluster
    b = kafka_bootstrap
    held, free = f"held-{uuid.uuid4().hex[:6]}", f"free-{uuid.uuid4().hex[:6]}"
    unsigned = cli(b, prefix, site, "jobs", "hold", held, "--for", "1h", "--reason", "x")
    assert unsigned.returncode == EXIT_REFUSED and "jobs hold refused" in unsigned.stderr
    out = cli(b, prefix, site, "jobs", "hold", held, "--for", "1h", "--reason", "debugging",
              key="ops")
    assert out.returncode == 0 and f"job {held} held" in out.stdout, out.stderr
    wait_event(plog, "job_hold", 60, where=lambda e: e.get("job") == held)
    listed = [json.loads(x) for x in cli(b, prefix, site, "jobs", "--json").stdout
              .splitlines() if x.strip()]
    assert [(h["job"], h["kind"], h["reason"]) for h in listed] == [(held, "hold", "debugging")]
    agents = [run_agent(b, prefix, site, tmp_path, job, "n1", NCCL, "--on-restart", "exit",
                        "--decision-wait-s", "15") for job in (held, free)]
    codes = [a.wait(180) for a in agents]
    assert codes == [77, 75], [a.stderr.read()[-2000:] for a in agents if a.stderr]
    [notice] = decisions(b, prefix, held)
    assert (notice["action"], notice["evidence"]["held"]["action"]) == ("notify", "restart")
    assert [d["action"] for d in decisions(b, prefix, free)] == ["restart"]  # the control
    snap = wait_until(lambda: snapshots(b, prefix, site).get(held), 60, "the held job's status")
    assert [h["kind"] for h in snap["holds"]] == ["hold"]
    row = next(ln for ln in cli(b, prefix, site, "status").stdout.splitlines() if held in ln)
    assert "decided,held" in row, row
    described = cli(b, prefix, site, "describe", held)
    assert described.returncode == 0, described.stderr
    assert "held by" in described.stdout and "debugging" in described.stdout
    assert "(held by" in described.stdout and "would restart" in described.stdout
    assert cli(b, prefix, site, "describe", f"never-{held}").returncode == EXIT_NOT_FOUND
    end = cli(b, prefix, site, "jobs", "release", held, key="ops")
    assert end.returncode == 0 and "ended" in end.stdout, end.stderr
    again = cli(b, prefix, site, "jobs", "release", held, key="ops")
    assert again.returncode == EXIT_NOT_FOUND and "no hold in force" in again.stderr
