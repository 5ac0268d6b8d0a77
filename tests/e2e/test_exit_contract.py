"""The exit-code contract of `faultwatch run` and `faultwatch agent` (docs/cli.md#exit-codes),
row by row with real processes: the embedded `run` and a real agent against the shared broker
and a real `faultwatch process`. The command's own code never passes through: children that
exit with every reserved number or die by the common signals exit with the code of the
decision made about them, and their own code and signal are reported in the verdict file,
the stderr line and the decision. Then the consumers that can run here: a plain shell loop
and torchrun's restarts (docs/schedulers.md#exit-codes has Slurm and Kubernetes)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from faultwatch.agents.exitcodes import (
    EXIT_ELSEWHERE,
    EXIT_FAILED,
    EXIT_NODES_TIMEOUT,
    EXIT_RESTART,
    EXIT_UNDECIDED,
)
from tests.support.cluster import processor
from tests.support.processes import faultwatch_exe, job_env

# each embedded run compiles the rules and runs the stages in-process: minutes on 2 busy cores
pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.timeout(900)]

RULES = """\
version: 1
policy:
  enable_restart: true
  max_restarts: 3
  settle_s: 0.5
  restart_backoff_s: 0.1
  hang_detection: false
rules: []
"""
RETRYABLE = "RuntimeError: Socket Timeout"
HARDWARE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
FATAL = "ModuleNotFoundError: No module named 'flux'"
CODE_OF_ACTION = {"restart": EXIT_RESTART, "blacklist": EXIT_ELSEWHERE, "fail": EXIT_FAILED}
# the numbers a verdict uses, and the common signal deaths (SIGUSR1 is 138 = "elsewhere")
RESERVED_EXITS = [75, 76, 77, 78, 129, 130, 138, 143]
SIGNALS = [signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV, signal.SIGABRT, signal.SIGUSR1,
           signal.SIGBUS]


@dataclass
class Mode:
    name: str
    rules: Path
    tmp: Path
    bootstrap: str = ""
    prefix: str = ""

    def cmd(self, job: str, child: list[str], *flags: str, prefix: str | None = None
            ) -> list[str]:
        out = ["--job", job, "--verdict-out", str(self.verdict_path(job)),
               "--decisions-out", str(self.tmp / f"{job}.decisions.jsonl"),
               "--term-grace-s", "2", *flags]
        if self.name == "run":
            return [faultwatch_exe(), "run", "--rules", str(self.rules), *out, "--", *child]
        return [faultwatch_exe(), "agent", "--bootstrap", self.bootstrap, "--topic-prefix",
                prefix or self.prefix, "--node", f"n-{job}", "--heartbeat-s", "1",
                "--spool-dir", str(self.tmp / "spool"), "--follow-decisions",
                "--decision-wait-s", "40", "--exit-flush-timeout-s", "5", *out, "--", *child]

    def verdict_path(self, job: str) -> Path:
        return self.tmp / f"{job}.verdict.json"

    def verdict(self, job: str) -> dict[str, Any]:
        return dict(json.loads(self.verdict_path(job).read_text()))

    def decisions(self, job: str) -> list[dict[str, Any]]:
        p = self.tmp / f"{job}.decisions.jsonl"
        return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


@pytest.fixture(scope="module")
def rules_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("rules") / "contract.yaml"
    p.write_text(RULES)
    return p


@pytest.fixture(scope="module")
def cluster(kafka_bootstrap: str, rules_file: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    prefix = f"exit{uuid.uuid4().hex[:8]}."
    log = tmp_path_factory.mktemp("exitproc") / "processor.log"
    with processor(kafka_bootstrap, prefix, log, "--rules", str(rules_file)) as proc:
        yield kafka_bootstrap, prefix
        assert proc.poll() is None, f"processor died:\n{log.read_text()[-4000:]}"


@pytest.fixture(params=["run", "agent"])
def mode(request: pytest.FixtureRequest, rules_file: Path, tmp_path: Path) -> Mode:
    if request.param == "run":
        return Mode("run", rules_file, tmp_path)
    bootstrap, prefix = request.getfixturevalue("cluster")
    return Mode("agent", rules_file, tmp_path, bootstrap, prefix)


def job_name(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:6]}"


def run_all(mode: Mode, children: dict[str, list[str]], *flags: str, timeout: float = 300
            ) -> dict[str, subprocess.CompletedProcess[str]]:
    """Run every child under its own agent (job = the key): agents all at once; embedded runs
    (each compiles the rules and runs a processor in-process) three at a time."""
    batch = 3 if mode.name == "run" else len(children)
    jobs = list(children)
    out = {}
    for i in range(0, len(jobs), batch):
        procs = {job: subprocess.Popen(mode.cmd(job, children[job], *flags), env=job_env(),
                                       text=True, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE)
                 for job in jobs[i:i + batch]}
        deadline = time.monotonic() + timeout
        for job, p in procs.items():
            try:
                o, e = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                o, e = p.communicate()
            out[job] = subprocess.CompletedProcess(p.args, p.returncode, o, e)
            assert mode.verdict_path(job).exists(), (job, p.returncode, e[-3000:])
    return out


def verdict_line(stderr: str) -> str:
    """The closing summary: `faultwatch run: <what happened>; verdict ...` (or `: verdict`)."""
    lines = [ln for ln in stderr.splitlines()
             if ln.startswith("faultwatch ") and ("; verdict " in ln or ": verdict " in ln)
             and "event=" not in ln]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


# embedded mode runs the collisions of issue 21 and one of each kind (each `run` costs a
# rule compile); the agent, against the shared processor, runs them all
RUN_SUBSET = {"exit138", "exit78", "exit75", "sigsigusr1", "sigsigterm", "sigsigkill"}


def test_reserved_codes_and_signal_deaths_exit_with_their_decisions_code(mode: Mode) -> None:
    children = {job_name(f"exit{c}"): ["sh", "-c", f"echo start; exit {c}"]
                for c in RESERVED_EXITS}
    children |= {job_name(f"sig{s.name.lower()}"):
                 ["sh", "-c", f"echo start; kill -{s.name[3:]} $$"] for s in SIGNALS}
    if mode.name == "run":
        children = {j: c for j, c in children.items() if j.split("-")[0] in RUN_SUBSET}
    results = run_all(mode, children, "--on-restart", "exit")
    for job, res in results.items():
        v = mode.verdict(job)
        dec = v["decision"]
        assert dec is not None, (job, res.stderr[-3000:])
        # the agent's code is the decision's, whatever the child's own code was
        assert res.returncode == CODE_OF_ACTION[dec["action"]] == v["exit_code"], \
            (job, res.returncode, dec, res.stderr[-2000:])
        assert res.returncode != EXIT_ELSEWHERE, (job, dec)  # none of these is hardware
        child = v["child"]
        if job.startswith("exit"):
            assert child["signal"] is None and f"exit{child['exit_code']}-" in job + "-"
            assert f"command exited with code {child['exit_code']}" in verdict_line(res.stderr)
        else:
            sig = signal.Signals[child["signal_name"]]
            assert job.startswith(f"sig{sig.name.lower()}-")
            assert child["exit_code"] == 128 + sig
            assert f"command was killed by {sig.name} (code {128 + sig})" \
                in verdict_line(res.stderr)
        # the decision itself reports the child's code and signal
        full = [d for d in mode.decisions(job) if d["id"] == dec["id"]]
        assert full, mode.decisions(job)
        (exit_,) = full[0]["evidence"]["exits"].values()
        assert (exit_["exit_code"], exit_["signal"]) == (child["exit_code"], child["signal"])
    # the collisions of issue 21: 138 by itself and a SIGUSR1 death are permanent failures
    # (no rule matched), not "run me elsewhere"; SIGTERM (a retryable rule) is "restart here"
    by_prefix = {job.split("-")[0]: (res.returncode, mode.verdict(job))
                 for job, res in results.items()}
    assert by_prefix["exit138"][0] == EXIT_FAILED
    assert by_prefix["sigsigusr1"][0] == EXIT_FAILED
    assert "was killed by SIGUSR1 (code 138)" in by_prefix["sigsigusr1"][1]["decision"]["message"]
    assert by_prefix["sigsigterm"][0] == EXIT_RESTART
    assert by_prefix["sigsigterm"][1]["next_attempt"] == 1


def test_each_verdict_row(mode: Mode, tmp_path: Path) -> None:
    """success, restart here, elsewhere (a running child stopped), failed, undecided."""
    sleep = f"{sys.executable} -c 'import time; time.sleep(60)'"
    children = {
        job_name("ok"): ["sh", "-c", "echo fine"],
        job_name("retry"): ["sh", "-c", f"echo '{RETRYABLE}' >&2; exit 1"],
        job_name("xid"): ["sh", "-c", f"echo '{HARDWARE}'; {sleep}"],
        job_name("fatal"): ["sh", "-c", f"echo '{FATAL}' >&2; exit 3"],
    }
    results = run_all(mode, children, "--on-restart", "exit")
    want = {"ok": (0, "success"), "retry": (EXIT_RESTART, "restart"),
            "xid": (EXIT_ELSEWHERE, "elsewhere"), "fatal": (EXIT_FAILED, "failed")}
    for job, res in results.items():
        code, name = want[job.split("-")[0]]
        v = mode.verdict(job)
        assert (res.returncode, v["verdict"], v["exit_code"]) == (code, name, code), \
            (job, res.returncode, v, res.stderr[-3000:])
        assert f"verdict {name} (exit {code})" in verdict_line(res.stderr)
    retry = next(j for j in results if j.startswith("retry"))
    assert mode.verdict(retry)["next_attempt"] == 1
    xid = next(j for j in results if j.startswith("xid"))
    assert mode.verdict(xid)["child"]["signal"] == signal.SIGTERM  # stopped by the agent
    fatal = next(j for j in results if j.startswith("fatal"))
    assert mode.verdict(fatal)["child"]["exit_code"] == 3  # its own code, reported only

    if mode.name == "run":  # the in-process stages decide at the exit: always a decision
        return
    # undecided: no processor answers (a prefix nobody processes: the processor is down)
    job = job_name("undecided")
    child = ["sh", "-c", f"echo '{FATAL}' >&2; exit 1"]
    cmd = mode.cmd(job, child, "--decision-wait-s", "3",
                   prefix=f"nobody{uuid.uuid4().hex[:6]}.")
    res = subprocess.run(cmd, env=job_env(), capture_output=True, text=True, timeout=120)
    v = mode.verdict(job)
    assert (res.returncode, v["verdict"]) == (EXIT_UNDECIDED, "undecided"), res.stderr[-3000:]
    assert v["decision"] is None and v["child"]["exit_code"] == 1
    # ... which is not what a fail decision gives (the same child, decided: 78, above)


def test_a_stopped_agent_exits_128_plus_its_signal_not_its_childs(mode: Mode) -> None:
    """The child ignores SIGTERM and is SIGKILLed after the grace (its own code: 137); the
    agent was stopped by SIGTERM: 143. A SIGUSR1 to the agent goes to the child and does not
    stop the agent (its default action would have been a 138 exit)."""
    job = job_name("stopped")
    child = [sys.executable, "-c",
             "import signal, sys, time\n"
             "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
             "signal.signal(signal.SIGUSR1, lambda *a: print('usr1', flush=True))\n"
             "print('ready', flush=True)\n"
             "time.sleep(120)\n"]
    p = subprocess.Popen(mode.cmd(job, child), env=job_env(), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
        p.send_signal(signal.SIGUSR1)
        assert p.stdout.readline().strip() == "usr1"  # passed on; the agent lives
        assert p.poll() is None
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    err = p.stderr.read() if p.stderr else ""
    v = mode.verdict(job)
    assert rc == 128 + signal.SIGTERM == v["exit_code"], err[-3000:]
    assert v["verdict"] == "interrupted" and v["agent_signal"] == "SIGTERM"
    assert (v["child"]["exit_code"], v["child"]["signal"]) == (137, signal.SIGKILL)


def test_nodes_timeout_and_faultwatchs_own_error(cluster: tuple[str, str],
                                                  tmp_path: Path, rules_file: Path) -> None:
    bootstrap, prefix = cluster
    mode = Mode("agent", rules_file, tmp_path, bootstrap, prefix)
    job = job_name("nodes")
    res = subprocess.run(mode.cmd(job, ["true"], "--wait-for-nodes", "2",
                                  "--wait-for-nodes-timeout-s", "3"),
                         env=job_env(), capture_output=True, text=True, timeout=120)
    v = mode.verdict(job)
    assert (res.returncode, v["verdict"]) == (EXIT_NODES_TIMEOUT, "nodes-timeout"), \
        res.stderr[-2000:]
    assert v["child"]["exit_code"] is None  # the command never ran
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nrules:\n  - id: x\n    nonsense: 1\n")
    res = subprocess.run([faultwatch_exe(), "run", "--rules", str(bad), "--", "true"],
                         env=job_env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 3 and f"{bad}:" in res.stderr, res.stderr[-2000:]  # RuleError


def test_a_shell_loop_relaunches_on_restart_and_stops_on_the_rest(mode: Mode) -> None:
    """The shell-loop row of docs/schedulers.md: 75 relaunches with the next attempt, 0 ends
    the loop, anything else is passed up. The child fails retryably in attempt 0 only."""
    job = job_name("loop")
    marker = mode.tmp / f"{job}.launches"
    child = ["sh", "-c", f'echo "$FAULTWATCH_ATTEMPT" >> {marker}; '
                         f'if [ "$FAULTWATCH_ATTEMPT" = 0 ]; then echo "{RETRYABLE}" >&2; '
                         f'exit 1; fi; echo done']
    argv = " ".join(f"'{a}'" for a in mode.cmd(job, child, "--on-restart", "exit"))
    script = f"""
attempt=0
while :; do
  FAULTWATCH_ATTEMPT=$attempt {argv}
  rc=$?
  case $rc in
    0) echo "loop: done after $attempt restart(s)"; exit 0 ;;
    {EXIT_RESTART}) attempt=$((attempt + 1)) ;;
    *) echo "loop: giving up with $rc"; exit $rc ;;
  esac
done
"""
    res = subprocess.run(["sh", "-c", script], env=job_env(), capture_output=True, text=True,
                         timeout=240)
    assert res.returncode == 0 and "loop: done after 1 restart(s)" in res.stdout, \
        res.stdout[-1000:] + res.stderr[-3000:]
    assert marker.read_text().split() == ["0", "1"]  # FAULTWATCH_ATTEMPT passed on


def test_torchrun_restarts_a_worker_whose_agent_exits_restart() -> None:
    """torchrun's row: agents in rank mode under torchrun (`faultwatch run` per rank), a rank
    that fails retryably exits 75 and torchrun restarts the group (any non-zero code does);
    the relaunched rank (TORCHELASTIC_RESTART_COUNT=1) succeeds."""
    train_bin = Path(sys.executable).parent
    torchrun = train_bin / "torchrun"
    child = ("import os, sys\n"
             "n = os.environ['TORCHELASTIC_RESTART_COUNT']\n"
             "print('restart count', n, flush=True)\n"
             f"sys.exit(0) if n != '0' else (print({RETRYABLE!r}, file=sys.stderr), "
             "sys.exit(1))\n")
    res = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "1",
                          "--max-restarts", "1", "--no-python", faultwatch_exe(), "run",
                          "--on-restart", "exit", "--", sys.executable, "-c", child],
                         env=job_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    assert "restart count 0" in res.stdout and "restart count 1" in res.stdout
    assert f"verdict restart (exit {EXIT_RESTART})" in res.stderr
    assert "verdict success (exit 0)" in res.stderr
