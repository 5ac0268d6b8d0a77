"""LineSplitter: chunk boundaries, CRLF, \r progress bars, truncation, UTF-8, seq numbers."""

from __future__ import annotations

import random

from faultwatch.agents.reader import LineBlock, LineSplitter, Piece, expand
from faultwatch.core.events import CR_PROGRESS, INVALID_UTF8, TRUNCATED, Line


def _texts(lines: list[Line]) -> list[str]:
    return [ln.text for ln in lines]


def test_split_mid_line_across_chunks() -> None:
    sp = LineSplitter("stdout")
    out = sp.feed(b"hel", 1.0) + sp.feed(b"lo\nwor", 2.0) + sp.feed(b"ld\n", 3.0)
    assert _texts(out) == ["hello", "world"]
    assert [ln.ts for ln in out] == [2.0, 3.0]
    assert all(ln.flags == 0 and ln.orig_len == 0 and ln.stream == "stdout" for ln in out)


def test_many_lines_in_one_chunk_and_empty_lines() -> None:
    sp = LineSplitter("stderr")
    out = sp.feed(b"a\n\nb\nc\nrest", 1.0)
    assert _texts(out) == ["a", "", "b", "c"]
    assert _texts(sp.flush(2.0)) == ["rest"]
    assert sp.flush(3.0) == []


def test_crlf_including_split_between_chunks() -> None:
    sp = LineSplitter("stdout")
    out = sp.feed(b"one\r\ntwo\r", 1.0) + sp.feed(b"\nthree\r\n", 1.0)
    assert _texts(out) == ["one", "two", "three"]
    assert all(ln.flags == 0 for ln in out)


def test_seq_numbers_start_at_zero_and_are_consecutive() -> None:
    sp = LineSplitter("stdout")
    out: list[Line] = []
    for i in range(100):
        out += sp.feed(f"line {i}\n".encode(), float(i))
    out += sp.feed(b"x\ry\rz", 200.0) + sp.flush(201.0)
    assert [ln.seq for ln in out] == list(range(len(out)))


def test_tqdm_bar_rate_limited_last_kept() -> None:
    sp = LineSplitter("stderr", progress_interval_s=1.0)
    out: list[Line] = []
    # 50 updates 0.1 s apart, as tqdm draws them, then the closing newline.
    for i in range(50):
        out += sp.feed(f"\r{i * 2:3d}%|bar|".encode(), 10.0 + i * 0.1)
    out += sp.feed(b"\r100%|bar|", 15.0)
    out += sp.feed(b"\n", 15.05)
    out += sp.feed(b"after\n", 15.1)
    assert all(ln.flags & CR_PROGRESS for ln in out[:-1])
    assert out[-1].text == "after" and out[-1].flags == 0
    progress = out[:-1]
    # one per second at most (plus the always-kept last update)
    assert 4 <= len(progress) <= 7
    assert progress[-1].text == "100%|bar|"
    ts = [ln.ts for ln in progress[:-1]]
    assert all(b - a >= 1.0 - 1e-9 for a, b in zip(ts, ts[1:], strict=False))


def test_last_progress_kept_when_bar_ends_with_blank_segment_or_eof() -> None:
    sp = LineSplitter("stderr", progress_interval_s=10.0)
    out = sp.feed(b"\r 1%", 0.0) + sp.feed(b"\r 2%", 0.1) + sp.feed(b"\r 3%\r", 0.2)
    assert _texts(out) == [" 1%"]
    out += sp.feed(b"    \r\n", 0.3)  # tqdm's clear then newline
    assert _texts(out) == [" 1%", " 3%"]
    sp2 = LineSplitter("stderr", progress_interval_s=10.0)
    out2 = sp2.feed(b"\rA\rB\rC", 0.0) + sp2.flush(0.5)
    assert _texts(out2) == ["A", "C"]
    assert all(ln.flags == CR_PROGRESS for ln in out2)


def test_tick_emits_held_progress_after_interval() -> None:
    sp = LineSplitter("stderr", progress_interval_s=1.0)
    assert _texts(sp.feed(b"\ra\rb\rc", 0.0)) == ["a"]
    assert sp.has_pending and sp.pending_due == 1.0
    assert sp.tick(0.5) == []
    held = sp.tick(1.0)  # "c" is the bar currently drawn (tqdm leaves it unterminated)
    assert _texts(held) == ["c"] and held[0].flags == CR_PROGRESS
    assert not sp.has_pending and sp.tick(5.0) == []
    assert sp.feed(b"\n", 6.0) == []  # not emitted twice
    assert _texts(sp.feed(b"\rx\ry\r", 7.0)) == ["x"]
    assert sp.pending_due == 8.0 and _texts(sp.tick(8.0)) == ["y"]
    assert _texts(sp.feed(b"\rz\n", 8.1)) == ["z"]
    assert sp.last_activity_ts == 8.1


def test_ten_megabyte_line_truncated_with_orig_len() -> None:
    sp = LineSplitter("stdout", max_line_bytes=65536)
    big = b"x" * (10 * 1024 * 1024)
    out: list[Line] = []
    for i in range(0, len(big), 65536):
        out += sp.feed(big[i:i + 65536], 1.0)
        assert len(sp._buf) <= 65536  # never holds more than the limit
    out += sp.feed(b"\nnext\n", 2.0)
    assert len(out) == 2
    assert out[0].flags == TRUNCATED and out[0].orig_len == len(big)
    assert len(out[0].text) == 65536
    assert out[1].text == "next" and out[1].flags == 0 and out[1].seq == 1


def test_long_line_in_single_chunk_truncated() -> None:
    sp = LineSplitter("stdout", max_line_bytes=10)
    out = sp.feed(b"short\n" + b"y" * 25 + b"\nz\n", 1.0)
    assert [(ln.text, ln.flags, ln.orig_len) for ln in out] == [
        ("short", 0, 0), ("y" * 10, TRUNCATED, 25), ("z", 0, 0)]


def test_truncation_inside_multibyte_char_not_flagged_invalid() -> None:
    sp = LineSplitter("stdout", max_line_bytes=10)
    line = "ab" + "é" * 10  # 2 + 20 bytes; the cut at 10 bytes falls after 4 é
    out = sp.feed(line.encode() + b"\n", 1.0)
    assert out[0].flags == TRUNCATED and out[0].text == "abéééé"
    sp = LineSplitter("stdout", max_line_bytes=9)
    out = sp.feed(line.encode() + b"\n", 1.0)  # cut in the middle of an é
    assert out[0].text == "abééé" and out[0].orig_len == 22
    assert not out[0].flags & INVALID_UTF8


def test_invalid_utf8_flagged_and_replaced() -> None:
    sp = LineSplitter("stderr")
    out = sp.feed(b"bad \xff\xfe bytes\ngood\n", 1.0)
    assert out[0].flags == INVALID_UTF8 and "\ufffd" in out[0].text
    assert out[1].flags == 0 and out[1].text == "good"


def test_utf8_char_split_across_feeds_not_flagged() -> None:
    sp = LineSplitter("stdout")
    data = "loss=0.5 ✓ 損失\n".encode()
    cut = data.index("✓".encode()) + 1  # inside the 3-byte check mark
    out = sp.feed(data[:cut], 1.0) + sp.feed(data[cut:], 1.1)
    assert out[0].text == "loss=0.5 ✓ 損失" and out[0].flags == 0
    # every possible split point
    for k in range(1, len(data)):
        sp = LineSplitter("stdout")
        out = sp.feed(data[:k], 1.0) + sp.feed(data[k:], 1.0)
        assert len(out) == 1 and out[0].flags == 0, k


def _pieces_vs_lines(data: bytes, cuts: list[int], limit: int) -> tuple[list[Line], list[Line],
                                                                         int]:
    """Feed data cut at `cuts` to two splitters: feed() and feed_blocks(); (lines, expanded
    pieces, number of LineBlocks of several lines)."""
    a, b = LineSplitter("stdout", limit), LineSplitter("stdout", limit)
    lines: list[Line] = []
    pieces: list[Piece] = []
    prev = 0
    for k, c in enumerate([*cuts, len(data)]):
        lines += a.feed(data[prev:c], float(k))
        pieces += b.feed_blocks(data[prev:c], float(k))
        prev = c
    lines += a.flush(99.0)
    pieces += b.flush(99.0)
    blocks = sum(1 for p in pieces if isinstance(p, LineBlock) and p.nlines > 1)
    return lines, expand(pieces), blocks


def test_blocks_hold_exactly_the_lines_feed_makes() -> None:
    rnd = random.Random(7)
    for trial in range(200):
        limit = rnd.choice([4, 10, 64, 1000])
        parts = []
        for _ in range(rnd.randrange(1, 60)):
            kind = rnd.random()
            if kind < 0.6:
                parts.append(b"x" * rnd.randrange(0, 12) + b"\n")
            elif kind < 0.75:
                parts.append(b"y" * rnd.randrange(limit, 3 * limit) + b"\n")  # too long
            elif kind < 0.85:
                parts.append("é✓ ok".encode() + b"\n")
            elif kind < 0.9:
                parts.append(b"bad \xff\n")
            else:
                parts.append(b"no newline yet ")
        data = b"".join(parts)
        cuts = sorted(rnd.sample(range(len(data) + 1), min(3, len(data) + 1)))
        lines, expanded, _ = _pieces_vs_lines(data, cuts, limit)
        assert expanded == lines, (trial, data, cuts)
    # the positive control: plain lines of one read come as one block, not line by line
    lines, expanded, blocks = _pieces_vs_lines(b"a\nb\nc\nd\ne\n", [2], 64)
    assert expanded == lines and blocks == 1 and [ln.seq for ln in lines] == [0, 1, 2, 3, 4]


def test_a_long_line_anywhere_in_a_large_read_is_found() -> None:
    limit = 100
    for n in (limit + 1, limit + 2, 2 * limit, 3 * limit + 7):
        for at in range(0, 1000, 37):
            data = b"a\n" * at + b"L" * n + b"\n" + b"b\n" * 500
            out = LineSplitter("stdout", limit).feed(data, 1.0)
            long = [ln for ln in out if ln.flags & TRUNCATED]
            assert len(long) == 1 and long[0].orig_len == n, (n, at)
            assert len(out) == at + 501
    ok = b"first\n" + b"c" * limit + b"\n" + b"d\n" * 1000  # at the limit: no flag
    pieces = LineSplitter("stdout", limit).feed_blocks(ok, 1.0)
    assert pieces[0] == Line("stdout", 0, 1.0, "first")  # ends the (empty) partial line
    assert len(pieces) == 2 and isinstance(pieces[1], LineBlock) and pieces[1].nlines == 1001
