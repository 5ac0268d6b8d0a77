"""Every file in deploy/ is checked by a test, and this module holds the checks that need no
broker or API server: Prometheus's own `promtool` on the config, the alert rules and their
unit tests; `systemd-analyze verify` on the unit; `bash -n` on the batch script; every
`faultwatch ...` command line in deploy/ parsed by faultwatch's own CLI; the agent pod snippet
agreeing with docs/agent.md; the Grafana dashboard's shape. The Kubernetes manifests are
dry-run against a real kube-apiserver (test_kubernetes_api.py), the metric names of the alerts
and the dashboard checked against a real processor's and agents' /metrics
(test_deploy_metrics.py)."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from faultwatch.cli.tree import parse_args

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"

# Which tests check each file of deploy/ (glob relative to deploy/ -> test ids). A file no
# pattern matches fails test_every_file_in_deploy_is_checked: add its check, then its line.
K8S = "tests/integration/test_kubernetes_api.py"
METRICS = "tests/integration/test_deploy_metrics.py"
HERE = "tests/integration/test_deploy_files.py"
SECURE = "tests/e2e/test_trust_attacks_secure.py"
CHECKED: dict[str, list[str]] = {
    "kubernetes/*.yaml": [
        f"{K8S}::test_every_manifest_in_deploy_passes_a_server_side_dry_run",
        f"{HERE}::test_faultwatch_command_lines_in_deploy_parse",
        f"{HERE}::test_every_shipped_consumer_is_on_the_secure_path",
        f"{SECURE}::test_case8_the_kubernetes_manifests_verify_what_they_act_on"],
    "prometheus/prometheus.yml": [
        f"{HERE}::test_promtool_checks_the_prometheus_config",
        f"{HERE}::test_agents_write_their_address_files_where_the_scrape_config_looks",
        f"{METRICS}::test_prometheus_finds_two_agents_of_one_host_through_their_address_files"],
    "prometheus/*-alerts.yml": [
        f"{HERE}::test_promtool_checks_the_prometheus_config",
        f"{HERE}::test_promtool_unit_tests_of_the_alert_rules_pass",
        f"{HERE}::test_faultwatch_command_lines_in_deploy_parse",
        f"{METRICS}::test_alert_rules_name_only_what_the_code_exports"],
    "prometheus/*-alerts.test.yml": [
        f"{HERE}::test_promtool_unit_tests_of_the_alert_rules_pass",
        f"{METRICS}::test_promtool_unit_tests_feed_only_series_the_code_exports"],
    "alertmanager/*.yml": [
        f"{HERE}::test_amtool_checks_the_alertmanager_config_and_its_routes",
        "tests/integration/test_alertmanager.py::"
        "test_decisions_become_alerts_that_group_silence_resend_and_resolve"],
    "grafana/*.json": [
        f"{HERE}::test_grafana_dashboards_are_well_formed",
        f"{METRICS}::test_dashboard_queries_name_only_what_the_code_exports"],
    "slurm/*.service": [
        f"{HERE}::test_systemd_units_verify",
        f"{HERE}::test_faultwatch_command_lines_in_deploy_parse",
        f"{HERE}::test_every_shipped_consumer_is_on_the_secure_path",
        f"{SECURE}::test_case8_the_slurm_units_verify_what_they_act_on"],
    "slurm/*.sbatch": [
        f"{HERE}::test_batch_scripts_are_valid_bash",
        f"{HERE}::test_faultwatch_command_lines_in_deploy_parse",
        f"{HERE}::test_every_shipped_consumer_is_on_the_secure_path",
        f"{SECURE}::test_case8_the_slurm_units_verify_what_they_act_on"],
}


def deploy_files(root: Path = DEPLOY) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def files(pattern: str) -> list[Path]:
    found = [DEPLOY / f for f in deploy_files() if fnmatch.fnmatch(f, pattern)]
    assert found, f"deploy/{pattern} matches nothing: the check would pass on nothing"
    return found


def unchecked(root: Path) -> list[str]:
    return [f for f in deploy_files(root) if not any(fnmatch.fnmatch(f, p) for p in CHECKED)]


def test_every_file_in_deploy_is_checked() -> None:
    missing = unchecked(DEPLOY)
    assert not missing, (f"files in deploy/ no test checks: {missing}; add a check and its "
                         f"line to CHECKED in {HERE}")
    for pattern, tests in CHECKED.items():
        assert any(fnmatch.fnmatch(f, pattern) for f in deploy_files()), pattern
        for test in tests:  # each named test exists (a rename must update the table)
            path, name = test.split("::")
            assert re.search(rf"^def {name}\(", (REPO / path).read_text(), re.M), test


def test_the_coverage_check_fails_on_a_file_nobody_checks(tmp_path: Path) -> None:
    """The guard above, shown to bite: a copy of deploy/ with one new file no pattern
    covers (a Helm values file, a new kind of Prometheus file)."""
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy)
    assert unchecked(copy) == []
    (copy / "helm").mkdir()
    (copy / "helm" / "values.yaml").write_text("replicas: 1\n")
    (copy / "prometheus" / "recording.yml").write_text("groups: []\n")
    assert unchecked(copy) == ["helm/values.yaml", "prometheus/recording.yml"]


# ---- Prometheus ------------------------------------------------------------------------------

def promtool() -> str:
    exe = shutil.which("promtool")
    assert exe, "promtool is missing: Debian's `prometheus` package (scripts/bootstrap.sh)"
    return exe


def test_promtool_checks_the_prometheus_config() -> None:
    """`promtool check config` reads the scrape config and the rule files it names;
    `check rules` each rule file on its own."""
    for cfg in files("prometheus/prometheus.yml"):
        out = subprocess.run([promtool(), "check", "config", cfg.name],
                             cwd=cfg.parent, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "SUCCESS" in out.stdout and "rule files found" in out.stdout, out.stdout
    for rules in files("prometheus/*-alerts.yml"):
        out = subprocess.run([promtool(), "check", "rules", str(rules)], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr


# Where deploy/alertmanager's routes send each kind of faultwatch alert (labels as
# faultwatch/notify/alerts.py sets them): the route example does what docs/operating.md says.
AM_ROUTES = {
    ("FaultwatchJobFailed", "critical"): "ml-platform-pager",
    ("FaultwatchJobRestart", "warning"): "ml-platform",
    ("FaultwatchNodeBlacklisted", "warning"): "ml-platform",
    ("FaultwatchNotice", "info"): "ml-platform",
    ("SomeoneElsesAlert", "critical"): "default",
}


def test_amtool_checks_the_alertmanager_config_and_its_routes() -> None:
    """`amtool check-config` (Debian's prometheus-alertmanager) reads the config, and
    `amtool config routes test` routes each of faultwatch's alertnames to its receiver."""
    from faultwatch.notify.alerts import ALERTNAMES, SEVERITY

    amtool = shutil.which("amtool")
    assert amtool, "Debian's prometheus-alertmanager is needed (scripts/bootstrap.sh)"
    assert {(ALERTNAMES[a], SEVERITY[a]) for a in ALERTNAMES} < set(AM_ROUTES)
    for cfg in files("alertmanager/*.yml"):
        out = subprocess.run([amtool, "check-config", str(cfg)], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr
        for (name, severity), want in AM_ROUTES.items():
            out = subprocess.run([amtool, "config", "routes", "test", f"--config.file={cfg}",
                                  f"alertname={name}", f"severity={severity}", "job=j"],
                                 capture_output=True, text=True, timeout=60)
            assert out.stdout.split() == [want], (name, out.stdout + out.stderr)


def test_promtool_unit_tests_of_the_alert_rules_pass() -> None:
    tested = set()
    for test in files("prometheus/*-alerts.test.yml"):
        out = subprocess.run([promtool(), "test", "rules", test.name], cwd=test.parent,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        doc = yaml.safe_load(test.read_text())
        tested |= {t["alertname"] for case in doc["tests"]
                   for t in case.get("alert_rule_test", [])}
    alerts = {r["alert"] for f in files("prometheus/*-alerts.yml")
              for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]
              if "alert" in r}
    assert alerts - tested == set(), "alerts without a promtool unit test"


def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """The unit tests are not vacuous: with one threshold changed, promtool reports a
    failure."""
    for f in files("prometheus/*-alerts*.yml"):
        shutil.copy(f, tmp_path / f.name)
    rules = next(tmp_path.glob("*-alerts.yml"))
    text = rules.read_text()
    assert "> 10000" in text
    rules.write_text(text.replace("> 10000", "> 100000"))  # the lag alert no longer fires
    test = next(tmp_path.glob("*-alerts.test.yml"))
    out = subprocess.run([promtool(), "test", "rules", test.name], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "FaultwatchConsumerLagHigh" in out.stdout + out.stderr


# ---- Grafana --------------------------------------------------------------------------------

def panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])


def test_grafana_dashboards_are_well_formed() -> None:
    for path in files("grafana/*.json"):
        dash = json.loads(path.read_text())
        assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36, path
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        ids = [p["id"] for p in panels(dash)]
        assert len(ids) == len(set(ids)), "panel ids repeat"
        queries = 0
        for p in panels(dash):
            g = p["gridPos"]
            assert g["x"] >= 0 and g["x"] + g["w"] <= 24, (p["title"], g)
            if p["type"] == "row":
                continue
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
            assert p.get("description"), f"panel {p['title']!r} says nothing about itself"
            for t in p["targets"]:
                assert t["expr"].strip() and t["refId"], p["title"]
                queries += 1
        assert queries >= 10, queries


# ---- Slurm: the systemd unit and the batch script --------------------------------------------

def test_systemd_units_verify(tmp_path: Path) -> None:
    """`systemd-analyze verify` on each unit, with ExecStart's program pointed at this
    checkout's faultwatch (the unit's /opt path does not exist here)."""
    exe = shutil.which("systemd-analyze")
    assert exe, "systemd-analyze is missing (Debian's `systemd` package)"
    here = Path(sys.executable).parent / "faultwatch"
    for unit in files("slurm/*.service"):
        text = unit.read_text()
        (program,) = re.findall(r"^ExecStart=(\S+)", text, re.M)
        local = tmp_path / unit.name
        local.write_text(text.replace(program, str(here)))
        out = subprocess.run([exe, "verify", str(local)], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        # the check can fail: the unit as shipped names a program this machine lacks
        bad = subprocess.run([exe, "verify", str(unit)], capture_output=True, text=True,
                             timeout=60)
        assert bad.returncode != 0 and program in bad.stderr, bad.stderr


def test_batch_scripts_are_valid_bash() -> None:
    for script in files("slurm/*.sbatch"):
        out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert re.search(r"^#SBATCH --nodes=\d+", script.read_text(), re.M)


# ---- faultwatch command lines ----------------------------------------------------------------

def _shell_words(line: str) -> list[str]:
    """A shell line's words with variables ($X, ${X}, "$(X)" in Kubernetes) as `1`."""
    line = re.sub(r"\$\((\w+)\)|\$\{\w+\}|\$\w+", "1", line)
    return shlex.split(line, comments=True)


def _from_faultwatch(words: list[str]) -> list[str] | None:
    for i, w in enumerate(words):
        if w == "faultwatch" or w.endswith("/faultwatch"):
            return words[i + 1:]
    return None


def _k8s_commands(path: Path) -> Iterator[list[str]]:
    for doc in yaml.safe_load_all(path.read_text()):
        for c in _containers(doc):
            argv = [re.sub(r"\$\((\w+)\)", "1", str(a))
                    for a in [*(c.get("command") or []), *(c.get("args") or [])]]
            if argv and argv[0] == "faultwatch":
                yield argv[1:]
            elif c.get("args") and "faultwatch" in c.get("image", ""):  # its ENTRYPOINT
                yield argv


def _containers(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from value
            else:
                yield from _containers(value)
    elif isinstance(node, list):
        for item in node:
            yield from _containers(item)


def deploy_commands() -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    for path in files("kubernetes/*.yaml"):
        out += [(path.name, argv) for argv in _k8s_commands(path)]
    for path in files("slurm/*.service"):
        for line in re.findall(r"^ExecStart=(.*)$", path.read_text(), re.M):
            argv = _from_faultwatch(_shell_words(line))
            if argv is not None:
                out.append((path.name, argv))
    for path in files("slurm/*.sbatch"):
        text = path.read_text().replace("\\\n", " ")
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            argv = _from_faultwatch(_shell_words(line))
            if argv:
                out.append((path.name, argv))
    for path in files("prometheus/*-alerts.yml"):
        for snippet in re.findall(r"`(faultwatch [^`]+)`", path.read_text()):
            out.append((path.name, _shell_words(snippet)[1:]))
    return out


def test_faultwatch_command_lines_in_deploy_parse(capsys: pytest.CaptureFixture[str]) -> None:
    """Every `faultwatch ...` in deploy/ (containers, ExecStart, srun, alert texts) is a
    command line faultwatch's own parser accepts: a renamed or removed flag fails here."""
    commands = deploy_commands()
    where = {name for name, _ in commands}
    assert {"processor.yaml", "agent-pod-snippet.yaml", "faultwatch-processor.service",
            "train.sbatch", "faultwatch-alerts.yml"} <= where, where
    bad = []
    for name, argv in commands:
        try:
            parse_args(argv)
        except SystemExit:
            bad.append(f"{name}: faultwatch {shlex.join(argv)}\n  {capsys.readouterr().err}")
    assert not bad, "\n".join(bad)
    with pytest.raises(SystemExit):  # the check can fail: a flag that does not exist
        parse_args(["decisions", "--topic", "faultwatch.deadletter"])


# ---- the secure path (issue 35 item 5) -------------------------------------------------------

ROLE_OF = {"process": "processor", "notify": "actuator", "actuate": "actuator",
           "agent": "agent"}


def shipped_consumers() -> list[tuple[str, list[str], dict[str, str], set[str]]]:
    """(where, argv, env, Secrets mounted) of every faultwatch process deploy/ runs: the
    Kubernetes containers, the systemd units, the batch script's agents."""
    out = []
    for path in files("kubernetes/*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = (doc or {}).get("spec", doc) or {}
            spec = (spec.get("template") or {}).get("spec", spec) if isinstance(spec, dict) \
                else {}
            vols = {v["name"]: v for v in spec.get("volumes", [])}
            for c in _containers(doc):
                argv = [*(c.get("command") or []), *(c.get("args") or [])]
                argv = argv[1:] if argv and argv[0] == "faultwatch" else argv
                if not argv or argv[0] not in ROLE_OF:
                    continue
                env = {e["name"]: str(e.get("value", e.get("valueFrom")))
                       for e in c.get("env", [])}
                secrets = {vols[m["name"]]["secret"]["secretName"]
                           for m in c.get("volumeMounts", []) if "secret" in vols[m["name"]]}
                out.append((f"{path.name}:{c['name']}", argv, env, secrets))
    for path in files("slurm/*.service"):
        text = path.read_text()
        env = dict(line.split("=", 1) for line in re.findall(r"^Environment=(.*)$", text, re.M))
        (line,) = re.findall(r"^ExecStart=(.*)$", text, re.M)
        out.append((path.name, _from_faultwatch(_shell_words(line)) or [], env, set()))
    for path in files("slurm/*.sbatch"):
        text = path.read_text()
        env = dict(re.findall(r"^export (\w+)=(\S+)", text, re.M))
        for name, argv in deploy_commands():
            if name == path.name and argv[0] == "agent":
                out.append((name, argv, env, set()))
    return out


def test_every_shipped_consumer_is_on_the_secure_path() -> None:
    """Ed25519 and a trust file everywhere, one Kafka client file per role, no legacy HMAC
    key, no key in a training job beyond its node's own, webhooks from a file. (That each
    of them then refuses what it must is tests/e2e/test_trust_attacks_secure.py's case 8,
    which runs them.)"""
    found = shipped_consumers()
    kinds = {(where.split(":")[0], argv[0]) for where, argv, _, _ in found}
    assert {("processor.yaml", "process"), ("processor.yaml", "notify"),
            ("actuate-deployment.yaml", "actuate"), ("training-job.yaml", "agent"),
            ("agent-pod-snippet.yaml", "agent"), ("faultwatch-processor.service", "process"),
            ("faultwatch-notify.service", "notify"), ("faultwatch-actuate.service", "actuate"),
            ("train.sbatch", "agent")} <= kinds, kinds
    for where, argv, env, secrets in found:
        role = ROLE_OF[argv[0]]
        assert env.get("FAULTWATCH_KAFKA_CONFIG", "").endswith(f"/{role}.yaml"), (where, env)
        assert env.get("FAULTWATCH_TRUST_FILE"), where
        assert not [k for k in env if "DECISION_KEY" in k or k == "FAULTWATCH_KAFKA_PASSWORD"
                    or k.startswith("FAULTWATCH_KAFKA_") and k != "FAULTWATCH_KAFKA_CONFIG"], \
            (where, env)
        assert ("FAULTWATCH_SIGNING_KEY_FILE" in env) == (role == "processor"), where
        assert ("FAULTWATCH_NODE_KEY_FILE" in env) == (role == "agent"), where
        assert "--webhook" not in argv and not any(a.startswith("--webhook=") for a in argv)
        if argv[0] == "notify":  # where it posts: a Secret file (URLs hold credentials)
            assert any(a.split("=")[0] in ("--webhook-file", "--alertmanager-file")
                       for a in argv), where
        if role == "agent":  # a training job holds its node's key and its Kafka role only
            assert secrets <= {"faultwatch-agent-kafka"}, (where, secrets)
    legacy = [str(p) for p in DEPLOY.rglob("*") if p.is_file() and
              re.search(r"DECISION_KEY|decision-keys|SLACK_WEBHOOK", p.read_text())]
    assert not legacy, legacy


# ---- the agent pod snippet and docs/agent.md -------------------------------------------------

def _env(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("valueFrom", e.get("value")) for e in entries}


def test_the_agent_pod_snippet_names_node_and_run_as_docs_agent_md_does() -> None:
    """The snippet and the documented pod spec give the agent the same identity: the node
    (spec.nodeName) as FAULTWATCH_NODE with that node's key (a blacklist names what actuate
    taints, like a kubelet under NodeRestriction), the scheduler identity from the downward
    API, the agent role's Kafka client file and the trust file."""
    doc = (REPO / "docs" / "agent.md").read_text()
    block = doc[doc.index("### Kubernetes"):]
    block = block[block.index("```yaml") + 7:]
    documented = _env(yaml.safe_load(block[:block.index("```")])["containers"][0]["env"])
    identity = ["FAULTWATCH_NODE", "FAULTWATCH_K8S_NAMESPACE", "FAULTWATCH_K8S_POD",
                "FAULTWATCH_K8S_NODE", "FAULTWATCH_K8S_UID", "FAULTWATCH_NODE_KEY_FILE",
                "FAULTWATCH_KAFKA_CONFIG", "FAULTWATCH_TRUST_FILE"]
    assert documented["FAULTWATCH_NODE"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    agents = [(path.name, c) for path in files("kubernetes/*.yaml")
              for d in yaml.safe_load_all(path.read_text()) for c in _containers(d)
              if "agent" in (c.get("command") or [])]
    assert {"agent-pod-snippet.yaml", "training-job.yaml"} <= {n for n, _ in agents}, agents
    for name, container in agents:
        shipped = _env(container["env"])
        for var in identity:
            assert var in shipped, f"{name} does not set {var}"
            assert shipped[var] == documented[var], (name, var, shipped[var], documented[var])


def test_agents_write_their_address_files_where_the_scrape_config_looks() -> None:
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (agents,) = [j for j in cfg["scrape_configs"] if j["job_name"] == "faultwatch-agent"]
    globs = [g for sd in agents["file_sd_configs"] for g in sd["files"]]
    written = []
    for name, argv in deploy_commands():
        args = parse_args(argv)
        if getattr(args, "metrics_address_file", None):
            assert args.metrics_port == 0, (name, "a fixed port with an address file")
            written.append((name, args.metrics_address_file))
    assert written, "no command in deploy/ writes an address file"
    for name, path in written:
        assert any(fnmatch.fnmatch(path.replace("{", "x").replace("}", "x"), g)
                   for g in globs), (name, path, globs)
