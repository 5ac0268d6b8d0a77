"""Who owns the rules in force, on a real broker with a real `faultwatch process` worker:
a push adds a layer over the worker's `--rules` files (it does not replace them), and
`rules show`, `rules diff`, `status` and the metrics name the version and its sources."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from faultwatch.errors import EXIT_RULES
from faultwatch.kafka import broker as kafka_local
from tests.support.cluster import processor, wait_log
from tests.support.processes import fw as _fw
from tests.support.pushed_rules import RETRYABLE, feed_failure, one_decision, rules_version_of
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

UNRELATED = """\
version: 1
rules:
  - id: site.warp-breach
    category: fatal
    contains: "the warp core breached"
"""

UNRELATED_FIX = UNRELATED.replace("fatal", "retryable")


def fw(*args: str) -> subprocess.CompletedProcess[str]:
    return _fw(*args, timeout=240)  # each parses the built-in rules: slow on a busy machine


def worker_records(bootstrap: str, prefix: str) -> list[dict[str, Any]]:
    out = fw("rules", "show", "--json", "--bootstrap", bootstrap, "--topic-prefix", prefix)
    assert out.returncode == 0, out.stderr
    return [json.loads(ln) for ln in out.stdout.splitlines() if ln.strip()]


def test_push_adds_a_layer_over_the_workers_rules_files_and_show_names_it(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    site = tmp_path / "my-rules.yaml"
    site.write_text(RETRYABLE)
    unrelated = tmp_path / "unrelated.yaml"
    unrelated.write_text(UNRELATED)
    port = kafka_local.free_port()
    log = tmp_path / "processor.log"
    with processor(kafka_bootstrap, topic_prefix, log, "--settle-s", "1", "--rules", str(site),
                   "--metrics-port", str(port)) as proc:
        wait_log(log, "processor_starting", timeout=90)

        # positive control: the worker's own file makes the error retryable
        job1 = f"files-{uuid.uuid4().hex[:6]}"
        feed_failure(kafka_bootstrap, topic_prefix, job1)
        d1 = one_decision(kafka_bootstrap, topic_prefix, job1)
        assert (d1["action"], d1["reason"]["rule"]) == ("restart", "site.flux-overheat"), d1

        # an unrelated push: its rules are added, the worker's --rules file stays
        out = fw("rules", "push", str(unrelated), "--bootstrap", kafka_bootstrap,
                 "--topic-prefix", topic_prefix)
        assert out.returncode == 0, out.stderr
        loaded = wait_until(lambda: [ln for ln in log.read_text().splitlines()
                                     if "event=rules_loaded" in ln],
                            60, "the pushed set loaded")[-1]
        version = re.search(r"version=(\w+)", loaded).group(1)  # type: ignore[union-attr]
        job2 = f"pushed-{uuid.uuid4().hex[:6]}"
        feed_failure(kafka_bootstrap, topic_prefix, job2)
        d2 = one_decision(kafka_bootstrap, topic_prefix, job2)
        assert (d2["action"], d2["reason"]["rule"]) == ("restart", "site.flux-overheat"), d2
        assert d2["rules_version"] == version
        # the worker runs built-in + its file + the push: neither of the two alone
        assert version not in (d1["rules_version"], rules_version_of(out.stdout))
        assert "source=pushed layers=builtin+files+pushed" in loaded, loaded

        # rules show: the worker, its version, its layers and their sources
        rec = wait_until(lambda: next((w for w in worker_records(kafka_bootstrap, topic_prefix)
                                       if w["rules"]["version"] == version), None),
                         60, "the worker's record with the pushed version")
        layers = {la["layer"]: la for la in rec["rules"]["layers"]}
        assert list(layers) == ["builtin", "files", "pushed"]
        assert layers["files"]["files"] == [str(site)]
        assert layers["files"]["ids"] == ["site.flux-overheat"]
        assert layers["pushed"]["files"] == ["unrelated.yaml"]
        assert layers["pushed"]["push_id"] and "@" in layers["pushed"]["author"]
        assert rec["rules"]["flags"] == {"settle_s": 1.0}
        text = fw("rules", "show", "--bootstrap", kafka_bootstrap, "--topic-prefix",
                  topic_prefix, "--rule", "site.flux-overheat").stdout
        assert f"rules version {version}" in text and str(site) in text, text
        assert f"push {layers['pushed']['push_id']} by {layers['pushed']['author']}" in text
        assert f"rule site.flux-overheat: in force <- files {site}:3" in text, text

        # status and the metrics name the version the worker runs
        status = fw("status", "--json", "--bootstrap", kafka_bootstrap, "--topic-prefix",
                    topic_prefix).stdout
        assert any(json.loads(ln).get("t") == "worker" and
                   json.loads(ln)["rules"]["version"] == version
                   for ln in status.splitlines() if ln.strip()), status
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10
                                         ).read().decode()
        info = next(ln for ln in metrics.splitlines() if ln.startswith("faultwatch_rules_info{"))
        assert f'version="{version}"' in info and 'source="pushed"' in info, info
        assert f'push_id="{layers["pushed"]["push_id"]}"' in info, info

        # rules diff: a pending push against the pushed set that runs
        fix = tmp_path / "unrelated-fix.yaml"
        fix.write_text(UNRELATED_FIX)
        diff = fw("rules", "diff", str(fix), "--bootstrap", kafka_bootstrap, "--topic-prefix",
                  topic_prefix, "--exit-code")
        assert diff.returncode == 1, diff
        assert "~ site.warp-breach: category fatal -> retryable" in diff.stdout, diff.stdout
        assert f"its --rules files ({site}) stay below the push" in diff.stdout, diff.stdout
        same = fw("rules", "diff", str(unrelated), "--bootstrap", kafka_bootstrap,
                  "--topic-prefix", topic_prefix, "--exit-code")
        assert same.returncode == 0 and "0 added, 0 removed, 0 changed" in same.stdout, same
        assert proc.poll() is None, log.read_text()[-3000:]
    # a clean stop (SIGTERM) removes the worker's record: `rules show` lists live workers
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert worker_records(kafka_bootstrap, topic_prefix) == [], log.read_text()[-3000:]


def test_rules_check_refuses_an_override_that_drops_builtin_patterns(tmp_path: Path) -> None:
    bad = tmp_path / "override.yaml"
    bad.write_text("version: 1\nrules:\n  - id: nccl-watchdog-timeout\n    category: fatal\n"
                   "    contains: my watchdog\n")
    out = fw("rules", "check", str(bad))
    assert out.returncode == EXIT_RULES, out
    assert re.search(rf"^{re.escape(str(bad))}:3: rule 'nccl-watchdog-timeout' overrides "
                     r"builtin nccl\.yaml:4 and would drop its patterns", out.stderr, re.M), out
    good = tmp_path / "merge.yaml"
    good.write_text(bad.read_text().replace("category: fatal", "override: merge\n"
                                            "    category: fatal"))
    assert fw("rules", "check", str(good)).returncode == 0
