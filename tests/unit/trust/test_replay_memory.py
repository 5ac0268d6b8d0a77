"""Issue 35 item 4: a consumer's replay memory covers the whole age window, whatever the
number of decisions in it, and forgets only what no copy could be young enough to act on."""

from __future__ import annotations

from pathlib import Path

from faultwatch.trust.replay import MAX_FUTURE_S, ReplayGuard

T = 1_700_000_000.0
AGE = 600.0


def test_an_id_let_act_late_in_its_window_is_refused_when_copied_with_a_fresh_time(
        tmp_path: Path) -> None:
    """1,100 decisions arrive 590 s after their evidence (a consumer catching up). 100 s
    later a copy of the first, stamped fresh, is a replay (before: its id was forgotten by
    its old time once more than 1,024 were kept, and the copy acted)."""
    g = ReplayGuard("decision", AGE, tmp_path / "seen")
    for i in range(1100):
        assert g.check(f"d{i}", T - 590, T, f"t[0]@{i}") is None
    later = T + 100
    assert g.check("fresh", later, later, "t[0]@2000") is None  # remembering prunes
    assert g.check("d0", later, later, "t[0]@2001") == "replayed"
    # ... and after a restart (the state file)
    again = ReplayGuard("decision", AGE, tmp_path / "seen")
    assert again.check("d1", later, later, "t[0]@2002") == "replayed"
    # positive control: a new id acts
    assert again.check("d-new", later, later, "t[0]@2003") is None


def test_memory_is_bounded_by_the_window_with_or_without_a_state_file(tmp_path: Path) -> None:
    for state in (None, tmp_path / "seen"):
        g = ReplayGuard("decision", AGE, state)
        n = 3000 if state is None else 1100  # (each remembered id is an fsync'd line)
        for i in range(n):
            g.check(f"d{i}", T, T, f"t[0]@{i}")
        assert len(g.seen) == n  # all inside the window: all kept, however many
        after = T + AGE + MAX_FUTURE_S + 1
        g.check("next", after, after, "t[0]@9999")
        assert set(g.seen) == {"next"}, (state, len(g.seen))
