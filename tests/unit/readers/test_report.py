"""`faultwatch report` from ledger records (readers/report.py, report_html.py, wire/incidents):
decoding refuses bad records, the text, JSON and HTML views, escaping of job text."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from faultwatch.core.events import Decision, Exit, Progress, RunStart, Stage
from faultwatch.core.goodput import account, summarise
from faultwatch.core.ledger import Ledger
from faultwatch.core.policy import Policy
from faultwatch.core.timeline import observe
from faultwatch.errors import DecodeError, NotFoundError
from faultwatch.readers import report
from faultwatch.readers.report_html import render_html
from faultwatch.wire.incidents import (
    decode_acted,
    decode_ledger,
    encode_acted,
    encode_ledger,
    incident_key,
)

T0 = 1_700_000_000.0
EVIL = "<script>alert(1)</script>"


def ledger(job: str = "j", message: str = "boom") -> Ledger:
    led = Ledger()

    def fold(*sigs: object, decs: tuple[Decision, ...] = ()) -> None:
        nonlocal led
        led = observe(led, list(sigs), list(decs), summarise=summarise)  # type: ignore[arg-type]

    fold(RunStart(job, 0, "n0", T0, run_id="r"))
    for k in range(1, 6):
        fold(Progress(job, 0, "n0", T0 + k, 0, k))
    fold(Stage(job, 0, "n0", T0 + 5.5, 0, "checkpoint", True, step=5),
         Stage(job, 0, "n0", T0 + 6, 0, "checkpoint", False, step=5))
    fold(Progress(job, 0, "n0", T0 + 7, 0, 6), Exit(job, 0, "n0", T0 + 8, 1))
    fold(decs=(Decision("d0", job, 0, "restart", "error", T0 + 9, rule="r1",
                        category="retryable", message=message,
                        evidence={"first_error": {"ts": T0 + 8, "node": "n0"}}),))
    fold(RunStart(job, 1, "n0", T0 + 10, run_id="r"), Progress(job, 1, "n0", T0 + 12, 0, 6),
         Progress(job, 1, "n0", T0 + 13, 0, 7), Exit(job, 1, "n0", T0 + 14, 0))
    return led


def record(led: Ledger, ts: float = T0 + 20) -> bytes:
    return encode_ledger(led, account(led), ts)


def test_a_record_round_trips_and_bad_ones_are_refused() -> None:
    led = ledger()
    d, back = decode_ledger(record(led))
    assert back == led and d["job"] == "j" and incident_key("j", "r") == b"j\x1fr"
    good = orjson.loads(record(led))
    for bad, why in [
            ({**good, "t": "status"}, "must be 'ledger'"),
            ({**good, "job": "a\nb"}, "ledger.job"),
            ({**good, "ledger": {**good["ledger"], "job": "other"}}, "the record's job"),
            ({**good, "ledger": {**good["ledger"], "first_ts": "inf"}}, "finite"),
            ({**good, "ledger": {**good["ledger"], "attempts": [{"n": "x"}]}}, "ledger"),
            ({**good, "ledger": {**good["ledger"], "incidents": [
                {**good["ledger"]["incidents"][0], "nodes": ["bad\x1bnode"]}]}}, "nodes")]:
        with pytest.raises(DecodeError, match=re.escape(why)):
            decode_ledger(orjson.dumps(bad))
    a = decode_acted(encode_acted("d0", "j", "n1", "quarantine", "slurm", "drained", T0))
    assert a["node"] == "n1"
    with pytest.raises(DecodeError):
        decode_acted(encode_acted("d0", "j", "n 1\n", "quarantine", "slurm", "ok", T0))


def test_files_keep_each_runs_latest_record_and_name_a_bad_line(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]
                                                                ) -> None:
    led = ledger()
    early = observe(Ledger(), [RunStart("j", 0, "n0", T0, run_id="r")], [])
    other = observe(Ledger(), [RunStart("j", 0, "n0", T0 + 100, run_id="r2")], [])
    f = tmp_path / "inc.jsonl"
    f.write_bytes(record(led) + b"\n" + b"{junk\n" + record(early, T0 + 30) + b"\n"
                  + record(other) + b"\n")
    runs = report.read_files([str(f)])
    assert set(runs) == {("j", "r"), ("j", "r2")}
    assert runs[("j", "r")][1] == led  # the higher revision wins, whatever the order
    assert f"{f}:2" in capsys.readouterr().err
    assert report.pick(runs, "j")[1].run_id == "r2"  # the latest run of the name
    assert report.pick(runs, "j", "r")[1] == led
    with pytest.raises(NotFoundError):
        report.pick(runs, "nope")


def test_the_job_report_in_text_and_json() -> None:
    led = ledger()
    runs = {("j", "r"): ({"ts": T0 + 20}, led)}
    rep = report.job_report(runs[("j", "r")], {"d0": [{"node": "n0", "action": "quarantine",
                                                        "backend": "slurm", "result": "ok",
                                                        "ts": T0 + 9.5}]},
                            report.lemon_watch(runs, Policy(), T0 + 20), T0 + 20)
    (i,) = rep["incidents"]
    assert i["lost"] == "lost 1 step, 2.0 s, since the checkpoint at step 5"
    assert (i["detect_s"], i["recover_s"]) == (1.0, 4.0)
    assert i["actuated"][0]["backend"] == "slurm"
    text = report.render_job(rep)
    assert rep["goodput"] in text and "lost 1 step" in text and "slurm quarantine n0" in text
    orjson.dumps(rep)  # JSON-able


def test_the_fleet_report_names_lemons() -> None:
    runs = {}
    for k in range(3):
        led = ledger(f"job{k}")
        runs[(led.job, led.run_id)] = ({"ts": T0 + 20}, led)
    now = T0 + 20
    lem = report.lemon_watch(runs, Policy(), now)
    rep = report.fleet_report(runs, None, lem, now)
    assert rep["runs"] == 3 and rep["lemons"] == [{"node": "n0", "jobs": ["job0", "job1",
                                                                         "job2"]}]
    assert "lemon nodes: n0 (3 jobs)" in report.render_fleet(rep)
    job = report.job_report(runs[("job0", "r")], {}, lem, now)
    assert [x["node"] for x in job["lemons"]] == ["n0"]


def test_the_html_page_escapes_job_text_and_draws_one_mark_per_incident() -> None:
    led = ledger(message=EVIL)
    runs = {("j", "r"): ({"ts": T0 + 20}, led)}
    rep = report.job_report(runs[("j", "r")], {}, report.lemon_watch(runs, Policy(), T0),
                            T0 + 20)
    page = render_html(rep)
    assert EVIL not in page and "&lt;script&gt;" in page
    assert "<script" not in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")
    assert page.count('class="incident"') == 1 and page.count('class="attempt"') == 2
    assert "Content-Security-Policy" in page
