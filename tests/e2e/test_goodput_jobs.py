"""Goodput against the truth of real jobs (embedded mode): a torchrun DDP job that crashes long
after its last checkpoint, hangs, is preempted and finishes, in one `faultwatch run`; a Hugging
Face Trainer (a tiny model built from a config, nothing downloaded) that crashes after a
checkpoint and resumes. Each job writes its own true timeline; every part faultwatch computes
from the logs alone must be within 2 s (or 2 %) of the truth, lost steps exact. The report's
HTML page is opened in a real headless Chromium: it renders, fetches nothing, and shows one
mark per incident."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.goodput_truth import (
    ExitWatch,
    compare,
    computed_parts,
    read_truth,
    true_parts,
)
from tests.support.processes import faultwatch_exe, job_env, torchrun_cmd

pytestmark = pytest.mark.slow

JOBS = Path(__file__).resolve().parent / "jobs"
TRAIN_VENV = Path(__file__).resolve().parents[2] / ".venv-train"
# a fixed hang window: long enough for torchrun's silent teardown under load (docs: the demo)
POLICY = """version: 1
policy:
  hang_window_s: 20
  init_window_s: 180
  settle_s: 1
  max_restarts: 6
  restart_backoff_s: 0.1
  diagnose: false
  hang_needs_evidence: false
"""


@dataclass
class Ran:
    rc: int
    output: str
    decisions: list[dict[str, Any]]
    report: dict[str, Any]
    truth: dict[str, Any]
    incidents_out: Path
    html: Path


def run_job(tmp: Path, cmd: list[str], env: dict[str, str], timeout: float) -> Ran:
    """`faultwatch run --incidents-out` over `cmd`; the report read back with the real CLI."""
    (tmp / "gp").mkdir()
    pol = tmp / "policy.yaml"
    pol.write_text(POLICY)
    dec, inc = tmp / "decisions.jsonl", tmp / "incidents.jsonl"
    truth = tmp / "gp" / "truth.jsonl"
    watch = ExitWatch(truth)
    proc = subprocess.run(
        [faultwatch_exe(), "run", "--job", "gp", "--rules", str(pol), "--decisions-out",
         str(dec), "--incidents-out", str(inc), "--term-grace-s", "5", "--", *cmd],
        env={**job_env(), **env, "GP_DIR": str(tmp / "gp")}, capture_output=True, text=True,
        timeout=timeout)
    exits = watch.stop()
    output = proc.stdout + proc.stderr
    decisions = [json.loads(x) for x in dec.read_text().splitlines()] if dec.exists() else []
    decisions = [d for d in decisions if d["action"] != "notify"]
    html = tmp / "report.html"
    rep = subprocess.run([faultwatch_exe(), "report", "gp", "--from", str(inc), "--json",
                          "--html", str(html)], capture_output=True, text=True, timeout=60,
                         env=job_env())
    assert rep.returncode == 0, rep.stderr + output[-3000:]
    decided = {d["attempt"]: d["ts"] for d in decisions}
    truth_d = true_parts(read_truth(truth), decided, max(exits.values()))
    return Ran(proc.returncode, output, decisions, json.loads(rep.stdout), truth_d, inc, html)


def check_against_truth(ran: Ran) -> None:
    acc = ran.report["account"]
    got, want = computed_parts(acc), ran.truth["parts"]
    table = "\n".join(f"  {k:<13} computed {got.get(k, 0.0):7.2f}  true {v:7.2f}"
                      for k, v in want.items())
    print(f"\n{ran.report['goodput']}\n{table}\n  wall: computed {acc['wall_s']:.2f}, "
          f"true {ran.truth['wall_s']:.2f}")
    assert compare(got, want) == [], table + "\n" + ran.output[-4000:]
    assert abs(acc["wall_s"] - ran.truth["wall_s"]) <= max(2.0, 0.02 * ran.truth["wall_s"])
    lost = {i["attempt"]: i["lost_steps"] for i in ran.report["incidents"]}
    assert lost == ran.truth["lost_steps"], (lost, ran.truth["lost_steps"])


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ran]:
    tmp = tmp_path_factory.mktemp("gp-ddp")
    yield run_job(tmp, torchrun_cmd(2, JOBS / "goodput_ddp.py"),
                  {"GP_PLAN": "crash@19,hang@23,preempt@26,none", "GP_STEPS": "30",
                   "GP_CKPTS": "5,20", "GP_EVALS": "8,16"}, timeout=400)


def test_ddp_crash_hang_preemption_against_the_truth(ddp: Ran) -> None:
    assert ddp.rc == 0, ddp.output[-4000:]
    assert [(d["attempt"], d["reason"]["kind"]) for d in ddp.decisions] == \
        [(0, "error"), (1, "hang"), (2, "error")], \
        [d["reason"]["message"] for d in ddp.decisions]
    causes = [(i["attempt"], i["cause"]) for i in ddp.report["incidents"]]
    assert causes == [(0, "error"), (1, "hang"), (2, "preemption")], causes
    crash, hang, pre = ddp.report["incidents"]
    assert (crash["ckpt_step"], crash["lost_steps"]) == (5, 13)  # steps 6-18 done again
    assert (hang["ckpt_step"], hang["lost_steps"]) == (20, 2)
    assert (pre["ckpt_step"], pre["lost_steps"]) == (20, 5)
    assert crash["lost"].startswith("lost 13 steps, ") and crash["lost"].endswith(
        "since the checkpoint at step 5")
    for i in ddp.report["incidents"]:
        assert i["acted_ts"] is not None and i["recovered_ts"] is not None, i
        assert i["first_sign_ts"] <= i["detected_ts"] <= i["acted_ts"] <= i["recovered_ts"]
    check_against_truth(ddp)
    line = next(ln for ln in ddp.output.splitlines() if ln.startswith("faultwatch: goodput "))
    assert line == f"faultwatch: {ddp.report['goodput']}"


def test_report_html_in_a_headless_browser(ddp: Ran, tmp_path: Path) -> None:
    """The page renders in Debian's Chromium (driven by Playwright, no browser download):
    no console error, no request beyond the page itself, one mark per incident coloured by
    cause, one bar per attempt, the badput chart."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Debian's `chromium` package is needed (scripts/bootstrap.sh installs it)"
    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(  # a fresh profile: user_data_dir
            str(tmp_path / "profile"), executable_path=chromium, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"])
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(ddp.html.as_uri(), wait_until="load")
            marks = page.eval_on_selector_all(
                "#timeline g.incident", "els => els.map(e => e.dataset.cause)")
            bars = page.locator("#timeline rect.attempt").count()
            parts = page.locator("#badput rect.part").count()
            shown = page.locator("svg#timeline").bounding_box()
            title = page.title()
        finally:
            browser.close()
    assert errors == [], errors
    assert requests == [ddp.html.as_uri()], requests  # nothing but the page itself
    assert marks == [i["cause"] for i in ddp.report["incidents"]] == \
        ["error", "hang", "preemption"]
    assert bars == len(ddp.report["attempts"]) == 4
    assert parts >= 5 and shown is not None and shown["width"] > 500
    assert title == "faultwatch report: gp"


def test_hf_trainer_crash_after_a_checkpoint_against_the_truth(tmp_path: Path) -> None:
    """A Trainer on a tiny GPT-2 built from a config (CPU, gloo, torchrun 2 ranks) with
    faultwatch's callback: rank 1 raises a retryable error after the checkpoint at step 10;
    the restart resumes from it."""
    py = TRAIN_VENV / "bin" / "python"
    if not py.exists():
        pytest.skip("the training image .venv-train is built by scripts/bootstrap.sh")
    cmd = [str(py), "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(JOBS / "goodput_hf.py")]
    ran = run_job(tmp_path, cmd, {"GP_PLAN": "crash@14,none", "GP_STEPS": "24",
                                  "GP_CKPTS": "10,20", "GP_EVALS": "16"}, timeout=400)
    assert ran.rc == 0, ran.output[-4000:]
    (i,) = ran.report["incidents"]
    assert (i["cause"], i["ckpt_step"], i["lost_steps"]) == ("error", 10, 3), i
    check_against_truth(ran)


if __name__ == "__main__":  # pragma: no cover - manual runs
    sys.exit(pytest.main([__file__, "-s"]))
