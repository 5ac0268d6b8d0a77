"""LineBatcher: blocks cut at line ends within the record limits, order and seqs kept, the
error hint (KEEP), the record size bound, linger."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from faultwatch import wire
from faultwatch.agents import batcher as batcher_mod
from faultwatch.agents.batcher import MAX_RECORD_BYTES, LineBatcher, _Hint, split_block
from faultwatch.agents.reader import LineBlock, LineSplitter, Piece, expand
from faultwatch.agents.spool import KEEP
from faultwatch.core.events import Line
from tests.support.waiting import wait_until_async


def _encode(pieces: list[Piece]) -> bytes:
    return wire.encode_line_chunks("j", 0, "n0", "r", pieces)


def _run(pieces: list[Piece], **kw: int) -> list[tuple[bytes, int, int]]:
    out: list[tuple[bytes, int, int]] = []

    async def main() -> None:
        b = LineBatcher(_encode, lambda v, f, n: out.append((v, f, n)), **kw)
        b.add(pieces)
        b.flush()

    asyncio.run(main())
    return out


def _decoded(recs: list[tuple[bytes, int, int]]) -> list[Line]:
    return [ln for v, _, _ in recs for ln in wire.lines_of(orjson.loads(v))]


def test_blocks_are_cut_at_line_ends_within_the_limits_and_keep_order() -> None:
    sp = LineSplitter("stdout")
    data = b"".join(b"step %06d %s\n" % (i, b"x" * (i % 50)) for i in range(20_000))
    pieces = sp.feed_blocks(data[:7], 1.0) + sp.feed_blocks(data[7:], 2.0)
    pieces += [Line("stderr", 0, 3.0, "cut", 1, 900)]
    assert sum(isinstance(p, LineBlock) for p in pieces) == 1  # one read: one block
    recs = _run(pieces, max_lines=3000, max_bytes=40_000)
    assert len(recs) > 10
    for v, _, n in recs:
        lines = wire.lines_of(orjson.loads(v))
        assert len(lines) == n <= 3000
        assert sum(len(ln.text) + 32 for ln in lines) <= 40_000 + 32 * len(lines)
    assert _decoded(recs) == expand(pieces)


def test_a_record_is_filled_to_its_line_limit_before_the_next() -> None:
    block = LineBlock("stdout", 10, 1.0, "\n".join(["a"] * 250), 0, 0, 250)
    recs = _run([Line("stdout", 9, 1.0, "first"), block], max_lines=100, max_bytes=1 << 20)
    assert [n for _, _, n in recs] == [100, 100, 51]
    assert [ln.seq for ln in _decoded(recs)] == list(range(9, 260))


def test_split_block_respects_lines_and_chars() -> None:
    b = LineBlock("stdout", 0, 1.0, "aaaa\nb\ncc\n\nddddddd", 0, 0, 5)
    head, rest = split_block(b, 3, 100) or (None, None)  # uneven lines: aims lower
    assert head is not None and rest is not None
    assert (head.text, head.nlines, rest.text, rest.nlines, rest.seq) == (
        "aaaa\nb", 2, "cc\n\nddddddd", 3, 2)
    head, rest = split_block(b, 4, 100) or (None, None)
    assert head is not None and rest is not None
    assert (head.text, head.nlines, rest.text, rest.nlines, rest.seq) == (
        "aaaa\nb\ncc\n", 4, "ddddddd", 1, 4)
    head, rest = split_block(b, 5, 7) or (None, None)
    assert head is not None and (head.text, head.nlines) == ("aaaa\nb", 2)
    assert split_block(b, 5, 3) is None  # not even the first line fits
    assert split_block(LineBlock("stdout", 0, 1.0, "one", 0, 0, 1), 1, 1) is None


@pytest.mark.parametrize("hyperscan", [True, False])
def test_an_error_word_anywhere_in_a_block_makes_the_record_keep(hyperscan: bool,
                                                                monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    hint = _Hint()
    if not hyperscan:
        hint._db = None
    monkeypatch.setattr(batcher_mod, "has_error_hint", hint)
    plain = "\n".join(f"step {i} loss=0.5" for i in range(1000))
    bad = plain.replace("step 700 loss=0.5", "RuntimeError: CUDA out of memory")
    recs = _run([LineBlock("stdout", 0, 1.0, plain, 0, 0, 1000),
                 LineBlock("stdout", 1000, 1.0, bad, 0, 0, 1000)], max_lines=1000)
    assert [f for _, f, _ in recs] == [0, KEEP]


def test_a_record_that_escapes_over_the_limit_is_split() -> None:
    ctl = "\x01" * 1000  # six bytes each once escaped in JSON
    block = LineBlock("stdout", 0, 1.0, "\n".join([ctl] * 600), 0, 0, 600)
    recs = _run([block], max_lines=10_000, max_bytes=1 << 20)
    assert len(recs) > 1 and all(len(v) <= MAX_RECORD_BYTES for v, _, _ in recs)
    assert _decoded(recs) == block.lines()


def test_linger_flushes_a_partial_record() -> None:
    out: list[int] = []

    async def main() -> None:
        b = LineBatcher(_encode, lambda v, f, n: out.append(n), linger_s=0.05)
        b.add([LineBlock("stdout", 0, 1.0, "a\nb", 0, 0, 2)])
        assert out == []
        await wait_until_async(lambda: out, 2, "the linger flush", interval_s=0.01,
                               raise_on_timeout=False)

    asyncio.run(main())
    assert out == [2]


def test_the_linger_grows_while_lines_flow_and_falls_back_when_quiet() -> None:
    # a record whose linger ran out full (>= BUSY_LINES) doubles the next linger up to the
    # bound; one that ran out with few lines brings it back to the first linger
    out: list[int] = []
    busy = "\n".join("x" * 8 for _ in range(batcher_mod.BUSY_LINES))

    async def main() -> None:
        b = LineBatcher(_encode, lambda v, f, n: out.append(n), linger_s=0.08,
                        first_linger_s=0.01)
        seen: list[float] = []

        async def record(text: str, nlines: int) -> None:
            seen.append(b.current_linger_s)
            before = len(out)
            b.add([LineBlock("stdout", 0, 1.0, text, 0, 0, nlines)])
            await wait_until_async(lambda: len(out) > before, 2.5, "the linger running out",
                                   interval_s=0.005)

        for _ in range(4):  # a flowing child: each record full when its linger runs out
            await record(busy, batcher_mod.BUSY_LINES)
        await record("quiet", 1)  # a quiet spell: a lone line
        seen.append(b.current_linger_s)
        assert seen == [0.01, 0.02, 0.04, 0.08, 0.08, 0.01]

    asyncio.run(main())
    assert out == [batcher_mod.BUSY_LINES] * 4 + [1]


def test_a_lone_line_ships_after_the_first_linger_not_the_bound() -> None:
    out: list[float] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        b = LineBatcher(_encode, lambda v, f, n: out.append(loop.time()), linger_s=5.0,
                        first_linger_s=0.02)
        t0 = loop.time()
        b.add([Line("stdout", 0, 1.0, "one line")])
        await wait_until_async(lambda: out, 4, "the lone line shipped", interval_s=0.01)
        assert out[0] - t0 < 2.5, "a quiet job's line waited for the bound"

    asyncio.run(main())
