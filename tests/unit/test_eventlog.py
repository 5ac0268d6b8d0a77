"""faultwatch's own event lines: levels, --log-format json, -q/-v and their defaults."""

from __future__ import annotations

import ast
import io
from pathlib import Path

import orjson
import pytest

from faultwatch import eventlog
from faultwatch.cli import options
from faultwatch.cli.tree import parse_args

PKG = Path(eventlog.__file__).parent


@pytest.fixture(autouse=True)
def _restore() -> object:
    before = eventlog.settings()
    yield
    eventlog.configure(*before)


def _logged(event: str, **fields: object) -> str:
    out = io.StringIO()
    eventlog.log_event(event, out, **fields)
    return out.getvalue()


def test_a_person_sees_warnings_and_the_rest_with_verbose() -> None:
    eventlog.configure("text", "warning")
    assert _logged("decision", id="d1") == ""  # told by the decision block instead
    assert _logged("child_started", pid=3) == ""
    assert "event=broker_down" in _logged("broker_down", spool_depth=2)
    assert "event=decision_refused_summary" in _logged("decision_refused_summary", count=3)
    assert "event=somebody_new" in _logged("somebody_new")  # unknown: shown, not hidden
    eventlog.configure(level="info")
    assert "event=decision id=d1" in _logged("decision", id="d1")
    assert _logged("probe", id="p") == ""  # debug
    eventlog.configure(level="error")
    assert _logged("broker_down") == ""


def test_json_is_one_object_per_line_with_the_text_fields() -> None:
    eventlog.configure("text", "info")
    text = _logged("no_decision", waited_s=1.5, why='a "b"\nc', gone=None)
    eventlog.configure("json")
    line = _logged("no_decision", waited_s=1.5, why='a "b"\nc', gone=None, path=Path("/x"))
    assert line.count("\n") == 1
    obj = orjson.loads(line)
    assert obj["event"] == "no_decision" and obj["level"] == "warning"
    assert obj["waited_s"] == 1.5 and obj["why"] == 'a "b"\nc' and obj["path"] == "/x"
    assert "gone" not in obj and "gone" not in text
    keys = [kv.split("=", 1)[0] for kv in text.split(" ") if "=" in kv and not kv[0] == '"']
    assert set(keys) - {"ts"} <= set(obj)


def test_every_event_the_code_names_has_a_level() -> None:
    names: dict[str, str] = {}
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)):
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            value = node.args[0].value
            if name in ("log", "_log", "log_event") and value.replace("_", "").isalpha() \
                    and value.islower():
                names[value] = f"{path.relative_to(PKG.parent)}:{node.lineno}"
    assert len(names) > 80  # the scan finds the events (it is not vacuous)
    missing = {n: where for n, where in names.items() if n not in eventlog.LEVELS}
    assert missing == {}


def test_flags_over_environment_over_the_commands_default(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.delenv(eventlog.LEVEL_ENV, raising=False)
    run = ["run", "--", "true"]
    assert options.log_level(parse_args(run)) == "warning"
    assert options.log_level(parse_args(["run", "-v", "--", "true"])) == "info"
    assert options.log_level(parse_args(["run", "-vv", "--", "true"])) == "debug"
    assert options.log_level(parse_args(["run", "-q", "--", "true"])) == "error"
    assert options.log_level(parse_args(["agent", "--job", "j", "--", "true"])) == "warning"
    assert options.log_level(parse_args(["process"])) == "info"
    monkeypatch.setenv(eventlog.LEVEL_ENV, "info")
    assert options.log_level(parse_args(run)) == "info"
    assert options.log_level(parse_args(["run", "-q", "--", "true"])) == "error"
    args = parse_args(["run", "--log-format", "json", "--", "true"])
    options.configure_logging(args)
    assert eventlog.settings() == ("json", eventlog.INFO)
