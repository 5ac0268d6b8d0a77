"""An operator's stop travels on the wire and no exit rule reads it as a failure."""

from __future__ import annotations

from faultwatch import wire
from faultwatch.core.events import Exit, Hit
from faultwatch.core.matching import signals_of_exit
from faultwatch.rules.engine import Matcher
from tests.support.rules import builtin_ruleset


def test_a_stopped_exit_round_trips_and_matches_no_exit_rule() -> None:
    ev = Exit("j", 0, "n0", 102.0, exit_code=137, signal=9, run_id="r1", stopped=True)
    back = wire.exit_of(wire.decode(wire.encode_exit(ev, "r1")))
    assert back == ev
    engine = Matcher(builtin_ruleset(), engine="re2")
    assert signals_of_exit(back, engine) == [back]
    plain = Exit("j", 0, "n0", 102.0, exit_code=137, signal=9, run_id="r1")
    assert any(isinstance(s, Hit) for s in signals_of_exit(plain, engine))  # control


def test_a_stopped_exit_survives_the_signals_topic() -> None:
    ev = Exit("j", 0, "n0", 102.0, exit_code=143, signal=15, run_id="r1", stopped=True)
    assert wire.decode_signals(wire.encode_signal(ev)) == [ev]
    plain = Exit("j", 0, "n0", 102.0, exit_code=143, signal=15, run_id="r1")
    assert wire.decode_signals(wire.encode_signal(plain)) == [plain]
