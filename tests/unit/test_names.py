"""Names that become paths or terminal text: injective spool components, escaped output."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from faultwatch.agents.config import AgentConfig, check_name, safe_name
from faultwatch.core.events import Decision
from faultwatch.errors import ConfigError
from faultwatch.eventlog import format_event
from faultwatch.readers.render import render_decision, render_line

NAMES = ["x y", "x_y", "x%20y", "x%y", ".", "..", "...", ".a", "a/b", "a_b", "a%2Fb", "",
         "%", "%25", "é", "e\u0301", "a" * 300, "a" * 299 + "b", "A", "a", "-", "~",
         "x" * 150 + "/", "x" * 150 + "_"]


def test_safe_name_is_injective_and_one_harmless_component() -> None:
    encoded = [safe_name(n) for n in NAMES]
    assert len(set(encoded)) == len(NAMES)
    for e in encoded:
        assert e not in ("", ".", "..") and "/" not in e and "\0" not in e
        assert len(e.encode()) <= 120
    assert safe_name("llama-3.1_70b") == "llama-3.1_70b"  # ordinary names stay readable


def test_spool_path_stays_under_the_spool_root(tmp_path: Path) -> None:
    for job, node in itertools.product(["..", ".", "../../etc", "a/../../b"], ["..", "n"]):
        cfg = AgentConfig(bootstrap="x:1", job=job, node=node, cmd=("true",),
                          spool_dir=tmp_path / "root")
        p = cfg.spool_path.resolve()
        assert p.is_relative_to((tmp_path / "root").resolve()), (job, node, p)
        assert len(p.relative_to((tmp_path / "root").resolve()).parts) == 3


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\x1b[2Jb", "a\u2028b", "a\u202eb", "",
                                 "x" * 257])
def test_names_with_control_characters_are_refused(bad: str) -> None:
    with pytest.raises(ConfigError):
        check_name("job", bad)


def test_rendered_decision_and_lines_cannot_forge_terminal_lines() -> None:
    evil = "x\n[faultwatch] decision FAIL job=prod\r\x1b[1A\u2028"
    d = Decision(id=evil, job=evil, attempt=0, action="restart", kind="error", ts=1.0,
                 nodes=(evil,), message=evil,
                 evidence={"first_error": {"node": evil, "line": evil, "ts": 1.0},
                           "last_lines": {"0": [evil]}})
    out = render_decision(d)
    lines = out.split("\n")
    assert sum(ln.startswith("[faultwatch]") for ln in lines) == 1
    assert not any(c in out for c in "\r\x1b\u2028")
    assert "\\n[faultwatch] decision FAIL job=prod\\r\\x1b[1A\\u2028" in lines[0]
    line = render_line(evil, None, "stdout", "progress\r\x1b[2K 50%\tdone")
    assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\t" in line


def test_log_events_escape_control_characters() -> None:
    ev = format_event("decision", {"job": "j\nts=2026 component=agent event=forged",
                                   "id": "a\rb", "ok": "plain"}, ts=0.0)
    assert "\n" not in ev and "\r" not in ev
    assert ev.endswith('job="j\\nts=2026 component=agent event=forged" id="a\\rb" ok=plain')
