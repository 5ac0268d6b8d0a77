"""An agent whose records the processors refuse is told why (issue 36 item 3): the matcher
names whose record it refused, the processor turns that into a bounded `records-refused`
notice, and the agent keeps it for its closing line (exit code unchanged)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from faultwatch import wire
from faultwatch.agents.control import note_refused, refused_why
from faultwatch.core.events import Line
from faultwatch.core.policy import Policy
from faultwatch.rules import Matcher
from faultwatch.streams.matcher_stage import MatcherStage
from faultwatch.streams.records import InRecord, LiveRules
from faultwatch.streams.refusal_notices import RefusalNotices
from faultwatch.trust.nodesig import NodeVerifier
from faultwatch.trust.refusals import LAST_REFUSED, is_refusal
from tests.support.rules import builtin_ruleset
from tests.unit.trust.helpers import make_key, trust_of

T0 = 1_700_000_000.0


def test_the_matcher_says_whose_record_it_refused(tmp_path: Path) -> None:
    _, node_line = make_key(tmp_path, "node", "n1")
    dead: list[Exception] = []
    rs = builtin_ruleset()
    stage = MatcherStage(LiveRules(Matcher(rs), Policy(), rs.version),
                         lambda r, e: dead.append(e),
                         node_verifier=NodeVerifier(trust_of(node_line)))
    now = time.time()
    line = wire.encode_lines("J", 2, "n2", "run-9", [Line("stderr", 0, now, "boom")])
    stage.process_batch([InRecord("p.logs", 0, 0, b"J/n2", line, ())], now)
    [err] = dead
    assert getattr(err, "about", None) == ("J", "n2", 2, "run-9")
    assert getattr(err, "reason", None) == "unsigned"
    assert LAST_REFUSED["logs"]["reason"] == "unsigned"  # what the worker announces


def test_notices_are_bounded_per_node_and_per_second() -> None:
    n = RefusalNotices(every_s=60.0, max_per_s=3, max_pairs=100)
    first = n.take(("J", "n2", 0, "r"), "unsigned", "no node signature", T0)
    assert first is not None and is_refusal(first)
    assert (first.job, first.nodes, first.run_id, first.action) == ("J", ("n2",), "r", "notify")
    assert "FAULTWATCH_NODE_KEY_FILE" in first.message and "trust file" in first.message
    assert n.take(("J", "n2", 0, "r"), "unsigned", "again", T0 + 30) is None  # told already
    again = n.take(("J", "n2", 0, "r"), "unsigned", "again", T0 + 61)
    assert again is not None and again.id != first.id  # a minute later: told again
    burst = [n.take((f"K{i}", "n", 0, "r"), "unsigned", "x", T0 + 100.5) for i in range(5)]
    assert sum(d is not None for d in burst) == 3  # at most 3 a second for the worker
    for i in range(200):
        n.take((f"M{i}", "n", 0, "r"), "unknown_key", "x", T0 + 200 + i)
    assert len(n.told) == 100


def test_the_agent_keeps_the_notice_for_its_node_and_says_it_at_the_end() -> None:
    logged: list[tuple[str, dict[str, Any]]] = []
    agent = SimpleNamespace(cfg=SimpleNamespace(node="n2"), refused=None,
                            log=lambda e, **f: logged.append((e, f)))
    n = RefusalNotices()
    other = n.take(("J", "n3", 0, "r"), "unsigned", "x", T0)
    mine = n.take(("J", "n2", 0, "r"), "unsigned", "no node signature", T0)
    assert other is not None and mine is not None
    assert not note_refused(agent, other)  # type: ignore[arg-type]
    assert refused_why(agent) == ""  # type: ignore[arg-type]
    assert note_refused(agent, mine) and note_refused(agent, mine)  # type: ignore[arg-type]
    assert [e for e, _ in logged] == ["records_refused"]  # said once per reason
    why = refused_why(agent)  # type: ignore[arg-type]
    assert why.startswith("the processors refuse this node's records (unsigned): ")
    assert "faultwatch keys generate --node NODE" in why
