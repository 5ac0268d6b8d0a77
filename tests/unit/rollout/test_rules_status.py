"""Worker records (which rules a worker runs), the rules-info metric, `rules diff`, and the one
live swap that embedded mode and the processors' watcher share."""

from __future__ import annotations

from pathlib import Path

from faultwatch.rollout.rules_record import build_record
from faultwatch.rollout.rules_status import info_labels, split_status, worker_lines, worker_record
from faultwatch.rollout.rules_watch import RulesWatcher
from faultwatch.rules import Matcher, layers
from faultwatch.rules import diff as rdiff
from faultwatch.streams.records import LiveRules
from faultwatch.wire import decode_worker, worker_key

SITE = """\
version: 1
rules:
  - id: site.flux-overheat
    category: retryable
    contains: "flux capacitor overheated"
"""
UNRELATED = """\
version: 1
rules:
  - id: site.warp-breach
    category: fatal
    contains: "the warp core breached"
policy:
  settle_s: 4
"""


def test_watcher_adds_the_push_over_the_files_and_a_tombstone_removes_it(tmp_path: Path
                                                                          ) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(SITE)
    (tmp_path / "unrelated.yaml").write_text(UNRELATED)
    base = layers.load([site], flags={"settle_s": 1.0})
    live = LiveRules(Matcher(base.ruleset), base.policy, base.version)
    logged: list[tuple[str, dict[str, object]]] = []
    w = RulesWatcher("unused:9", "t.rules", live, base, log=lambda e, **f: logged.append((e, f)))
    record, _ = build_record([tmp_path / "unrelated.yaml"])
    assert w.apply(record, "t.rules[0]@0")
    ids = {r.id for r in w.ruleset.rules}
    assert {"site.flux-overheat", "site.warp-breach"} <= ids  # the files stay
    assert live.rules is w.rules and live.rules_version == w.rules.version != base.version
    assert live.policy.settle_s == 1.0  # flags win over the push's 4
    assert logged[-1][0] == "rules_loaded" and logged[-1][1]["source"] == "pushed"
    pushed = w.rules.layer("pushed")
    assert pushed is not None and pushed.meta["at"] == "t.rules[0]@0"
    assert "@" in str(pushed.meta["author"]) and pushed.meta["push_id"]
    assert w.apply(None)  # tombstone: the pushed layer goes, the files stay
    assert live.rules_version == base.version and w.rules.layer("pushed") is None
    assert not w.apply(b'{"v": 1, "files": [{"name": "b.yaml", "text": "version: 2"}]}', "x")
    assert w.rejected == 1 and w.last_rejected is not None
    assert "b.yaml:1" in w.last_rejected["errors"][0]
    assert live.rules_version == base.version  # kept


def test_worker_record_round_trip_and_text(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(SITE)
    rules = layers.load([site])
    value = worker_record("h:1", "g", rules, 100.0, 90.0, 2, {"version": "x", "errors": ["e"]})
    rec = decode_worker(value)
    assert rec["rules"]["version"] == rules.version
    jobs, workers = split_status([(b"job-a", b"{}"), (worker_key("h:1"), value),
                                  (worker_key("h:2"), value), (worker_key("h:2"), None)])
    assert jobs == [b"{}"] and list(workers) == ["h:1"]  # h:2's tombstone removes it
    text = "\n".join(worker_lines(rec, 101.0, None))
    assert f"rules version {rules.version}" in text and str(site) in text
    assert "refused pushes: 2" in text
    assert "STALE" in "\n".join(worker_lines(rec, 1000.0, None))  # positive control
    assert "STALE" not in text
    why = "\n".join(worker_lines(rec, 101.0, "site.flux-overheat"))
    assert f"rule site.flux-overheat: in force <- files {site}:3" in why
    labels = info_labels(rules)
    assert labels == {"version": rules.version, "source": "files",
                      "layers": "builtin+files", "push_id": ""}


def test_a_worker_announces_its_trust_policy_and_what_it_refused(tmp_path: Path) -> None:
    """Issue 36 item 3: `rules show` and `status` say what the trust file refused."""
    from faultwatch.readers.status import workers_table
    from faultwatch.rollout.rules_status import refused_count

    rules = layers.load([])
    trust = {"verifies": ["rules", "node", "hold"], "keys": {"operator": ["abc"]},
             "node_keys": 0}
    refused = {"counts": {"rules.unsigned": 2, "node_record.unknown_key": 1},
               "last": {"rules": {"reason": "unsigned", "ts": 95.0,
                                  "detail": "the rules record carries no signature"}}}
    rec = decode_worker(worker_record("h:1", "g", rules, 100.0, 90.0, 1, {"version": "x"},
                                      trust, refused))
    text = "\n".join(worker_lines(rec, 101.0, None))
    assert "trust file: verifies rules, node, hold" in text
    assert "refused records: node_record.unknown_key 1, rules.unsigned 2" in text
    assert "last rules: unsigned 6 s ago: the rules record carries no signature" in text
    assert refused_count(rec) == 4  # 3 refused by the trust file, 1 invalid push
    plain = decode_worker(worker_record("h:2", "g", rules, 100.0, 90.0))
    assert refused_count(plain) == 0 and "trust file" not in "\n".join(
        worker_lines(plain, 101.0, None))  # an older worker's record says nothing of it
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(workers_table([rec], 101.0))
    shown = console.export_text().splitlines()
    at = next(ln for ln in shown if ln.startswith("worker ")).index("refused")
    row = next(ln for ln in shown if "h:1" in ln)
    assert row[at:].split()[0] == "4"  # the refused column (aligned columns, no borders)


def test_rules_info_metric_names_the_version() -> None:
    from prometheus_client import generate_latest

    from faultwatch.metrics import ProcessorMetrics

    m = ProcessorMetrics()
    info = {"version": "abc123", "source": "pushed", "layers": "builtin+pushed",
            "push_id": "p1"}
    m.watch_rules(lambda: info, lambda: 3)
    text = generate_latest(m.registry).decode()
    assert ('faultwatch_rules_info{layers="builtin+pushed",push_id="p1",source="pushed",'
            'version="abc123"} 1.0') in text
    assert "faultwatch_rules_rejected_total 3.0" in text


def test_diff_names_added_removed_changed_and_policy(tmp_path: Path) -> None:
    old_f, new_f = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old_f.write_text(SITE + "  - id: site.gone\n    category: fatal\n    contains: gone\n")
    new_f.write_text(SITE.replace("retryable", "hardware").replace(
        'contains: "flux capacitor overheated"',
        'contains: ["flux capacitor overheated", "flux coil"]') + UNRELATED.split("rules:\n")[1])
    d = rdiff.diff(layers.load([old_f]), layers.load([new_f]))
    assert [a["id"] for a in d["added"]] == ["site.warp-breach"]
    assert [r["id"] for r in d["removed"]] == ["site.gone"]
    (c,) = d["changed"]
    assert c["id"] == "site.flux-overheat"
    assert c["changes"]["category"] == ["retryable", "hardware"]
    assert c["changes"]["contains"] == {"added": ["flux coil"], "removed": []}
    assert d["policy"]["settle_s"][:2] == [3.0, 4.0]
    lines = rdiff.render(d)
    assert "~ site.flux-overheat: category retryable -> hardware; contains +'flux coil'  " \
           f"(files {new_f}:3)" in lines
    same = rdiff.diff(layers.load([old_f]), layers.load([old_f]))
    assert rdiff.is_empty(same) and not rdiff.is_empty(d)


def test_show_of_an_unknown_rule_is_not_found_with_the_close_ids(tmp_path: Path) -> None:
    """`rules show --rule cuda-omm` (issue 36 item 7): a typo is exit 7 naming cuda-oom, never
    "not overridden"; a rule a file disables is known (it says where)."""
    import io

    import pytest

    from faultwatch.errors import EXIT_NOT_FOUND, NotFoundError
    from faultwatch.rollout.rules_show import show_local

    site = tmp_path / "site.yaml"
    site.write_text("version: 1\nrules:\n  - id: nccl-watchdog-timeout\n    disabled: true\n")
    with pytest.raises(NotFoundError, match=r"unknown rule 'cuda-omm' \(did you mean "
                                            r"'cuda-oom'") as e:
        show_local([], rule_id="cuda-omm", out=io.StringIO())
    assert e.value.exit_code == EXIT_NOT_FOUND
    out = io.StringIO()
    assert show_local([], rule_id="cuda-oom", out=out) == 0  # positive control
    assert "rule cuda-oom: in force <- builtin" in out.getvalue()
    out = io.StringIO()
    assert show_local([str(site)], rule_id="nccl-watchdog-timeout", out=out) == 0
    assert "disabled at" in out.getvalue()
