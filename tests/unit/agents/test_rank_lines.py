"""torchrun children's lines with their rank: the environment that asks torchrun for the
prefix, and the splitter that rejoins each rank's partial lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from faultwatch.agents import torchrun_env
from faultwatch.agents.exitcodes import Story, Verdict
from faultwatch.agents.reader import LineSplitter, RankLineSplitter
from faultwatch.core.events import Decision

# what torchrun's tee printed while rank 0 had written half a line (seen with torch 2.15)
MERGED = (b"[rank0]:step 1 ok\n[rank0]:partial rank 0 [rank1]:partial rank 1 [rank0]:end\n"
          b"[rank1]:end\n[rank1]:[rank1]: Traceback (most recent call last):\nW1126 torchrun\n")


def _texts(split: LineSplitter, chunks: list[bytes]) -> list[tuple[int, str]]:
    lines = []
    for i, c in enumerate(chunks):
        lines += split.feed(c, float(i))
    lines += split.flush(9.0)
    return [(ln.seq, ln.text) for ln in lines]


@pytest.mark.parametrize("cut", [0, 5, 30, 60, len(MERGED) - 3])
def test_each_ranks_partial_line_is_rejoined_never_merged(cut: int) -> None:
    chunks = [MERGED[:cut], MERGED[cut:]] if cut else [MERGED]
    got = _texts(RankLineSplitter("stdout"), chunks)
    assert [t for _, t in got] == [
        "[rank0]:step 1 ok", "[rank0]:partial rank 0 end", "[rank1]:partial rank 1 end",
        "[rank1]:[rank1]: Traceback (most recent call last):", "W1126 torchrun"]
    assert [s for s, _ in got] == list(range(len(got)))  # contiguous: no gap, no duplicate
    # positive control: the plain splitter merges the two ranks on one line
    plain = [t for _, t in _texts(LineSplitter("stdout"), chunks)]
    assert "[rank0]:partial rank 0 [rank1]:partial rank 1 [rank0]:end" in plain


def test_a_rank_unfinished_at_the_end_is_emitted_at_flush() -> None:
    got = _texts(RankLineSplitter("stderr"), [b"[rank3]:half [rank2]:whole\n"])
    assert [t for _, t in got] == ["[rank2]:whole", "[rank3]:half "]


def _torch(tmp: Path, text: str) -> list[str]:
    py = tmp / "venv" / "bin" / "python3"
    run = tmp / "venv" / "lib" / "python3.11" / "site-packages" / "torch" / "distributed"
    run.mkdir(parents=True)
    (run / "run.py").write_text(text)
    py.parent.mkdir(parents=True)
    py.write_text("")
    script = py.parent / "torchrun"
    script.write_text(f"#!{py}\nimport sys\n")
    return [str(script), "--standalone", "train.py"]


def test_the_environment_is_set_only_for_a_torch_that_understands_it(tmp_path: Path) -> None:
    cmd = _torch(tmp_path, 'parser.add_argument("--tee", action=env)\n'
                           'os.getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")\n')
    env, why = torchrun_env.rank_env(cmd, {}, tmp_path / "logs")
    assert env == {"PET_TEE": "3", torchrun_env.TEMPLATE_ENV: "[rank${rank}]:",
                   "PET_LOG_DIR": str(tmp_path / "logs"), "PYTHONUNBUFFERED": "1"}, why
    # the user's own choices win
    assert torchrun_env.rank_env(cmd, {"PET_TEE": "1"}, tmp_path)[0] == {}
    assert torchrun_env.rank_env(cmd, {torchrun_env.OFF_ENV: "off"}, tmp_path)[0] == {}
    kept = torchrun_env.rank_env(cmd, {"PET_LOG_DIR": "/mine", "PYTHONUNBUFFERED": ""},
                                 tmp_path)[0]
    assert "PET_LOG_DIR" not in kept and "PYTHONUNBUFFERED" not in kept


def test_an_older_torch_gets_nothing(tmp_path: Path) -> None:
    cmd = _torch(tmp_path, 'parser.add_argument("--tee", action=env)\n')  # torch < 2.2
    env, why = torchrun_env.rank_env(cmd, {}, tmp_path)
    assert env == {} and "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE" in why


def test_the_summary_tells_attempts_restarts_and_causes() -> None:
    story = Story(started_ts=100.0)
    err = Decision("d1", "j", 0, "restart", "error", 112.34, ("n1",), (1,))
    note = Decision("d2", "j", 1, "notify", "slow", 130.0, ("n1",))
    story.add(err, "restart")
    story.add(note, "notify")
    story.restarts = 1
    v = Verdict("success", 0, child_exit_code=0, job="j", attempt=1, run_id="r")
    line = v.sentence("run", story)
    assert line.startswith("faultwatch run: succeeded in attempt 1 after 1 restart "
                           "(error of rank 1 at 12.3 s); 2 decisions; verdict success (exit 0)")
    assert Verdict("failed", 78, attempt=0).sentence("agent", Story(0.0)).startswith(
        "faultwatch agent: failed in attempt 0; no decisions; verdict failed (exit 78)")


def test_the_midline_check_agrees_with_its_regex() -> None:
    import random

    from faultwatch.agents.reader import _MIDLINE, has_midline

    parts = ["[rank0]:", "[rank12]:", "[rank", "]:", "\n", "x", "step 1 ", "[rankings]",
             "[rank1234567]:", "[rank12345678]:", "", " ", "loss:", "]"]
    rng = random.Random(5)
    seen = {True: 0, False: 0}
    for _ in range(20_000):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 8)))
        want = _MIDLINE.search(text) is not None
        assert has_midline(text) == want, text
        seen[want] += 1
    assert min(seen.values()) > 1_000  # both answers were exercised
