"""pump(): real pipes, raw tee copy, lines to the sink, dead tee fd, held \r updates."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from pathlib import Path

from faultwatch.agents.child import Child
from faultwatch.agents.reader import LineSplitter, Piece, TeeWriter, expand, pump
from faultwatch.core.events import CR_PROGRESS, Line


def test_pump_tees_raw_bytes_and_splits_lines(tmp_path: Path) -> None:
    raw = b"a\r\nb\rprogress\r\xffbad\n" + b"z" * 200_000 + b"\nend"
    (tmp_path / "raw").write_bytes(raw)
    r, w = os.pipe()

    async def main() -> list[Line]:
        got: list[Line] = []
        ch = await Child.spawn(["cat", str(tmp_path / "raw")])
        await asyncio.gather(pump(ch.stdout, LineSplitter("stdout", 1000), w, got.extend),
                             pump(ch.stderr, LineSplitter("stderr"), None, got.extend))
        await ch.wait()
        os.close(w)
        return got

    copied = bytearray()

    def drain() -> None:
        with os.fdopen(r, "rb") as f:
            copied.extend(f.read())

    t = threading.Thread(target=drain)
    t.start()
    got = asyncio.run(main())
    t.join(10)
    assert bytes(copied) == raw
    assert [ln.seq for ln in got] == list(range(len(got)))
    assert [ln.text[:5] for ln in got] == ["a", "b", "\ufffdbad", "z" * 5, "end"]
    assert got[-2].orig_len == 200_000


def test_dead_tee_fd_does_not_stop_the_pump() -> None:
    r, w = os.pipe()
    os.close(r)  # writing to w now fails with EPIPE

    async def main() -> tuple[int, TeeWriter]:
        n = 0

        def sink(lines: list[Line]) -> None:
            nonlocal n
            n += len(lines)

        tee = TeeWriter(w)
        ch = await Child.spawn(["sh", "-c", "for i in $(seq 1 2000); do echo line $i; done"])
        await pump(ch.stdout, LineSplitter("stdout"), None, sink, tee=tee)
        await ch.wait()
        await tee.aclose()
        return n, tee

    n, tee = asyncio.run(main())
    os.close(w)
    assert n == 2000
    assert tee.dead and tee.dropped_bytes > 0


def test_held_progress_emitted_while_stream_stays_silent() -> None:
    async def main() -> list[tuple[float, Line]]:
        got: list[tuple[float, Line]] = []
        loop = asyncio.get_running_loop()
        ch = await Child.spawn([sys.executable, "-c",
                                "import sys, time\n"
                                "for i in range(5): sys.stderr.write(f'\\r{i}/5'); "
                                "sys.stderr.flush()\n"
                                "time.sleep(1.5)\n"])
        await pump(ch.stderr, LineSplitter("stderr", progress_interval_s=0.3), None,
                   lambda ls: got.extend((loop.time(), ln) for ln in ls))
        await ch.wait()
        return got

    got = asyncio.run(main())
    texts = [ln.text for _, ln in got]
    assert texts[0] == "0/5" and texts[-1] == "4/5"
    assert all(ln.flags == CR_PROGRESS for _, ln in got)
    # "4/5" came from the timer, well before EOF at ~1.5 s
    assert got[-1][0] - got[0][0] < 1.0


def test_a_line_by_line_writer_is_read_in_gathered_chunks_with_every_line() -> None:
    """Given the pipe, pump pauses after a small read so the pipe gathers output: far fewer
    reads than the child's writes, every line in order (the control reads without it)."""
    writer = ("import os, time\n"
              "for i in range(1500):\n"
              "    os.write(1, b'line %d\\n' % i)\n"
              "    time.sleep(0.0005)\n")

    async def main(gather: bool) -> tuple[int, list[Line]]:
        calls: list[int] = []
        got: list[Line] = []

        def sink(pieces: list[Piece]) -> None:
            calls.append(1)
            got.extend(expand(pieces))

        ch = await Child.spawn([sys.executable, "-c", writer])
        await pump(ch.stdout, LineSplitter("stdout"), None, sink, blocks=True,
                   pipe=ch.pipe(1) if gather else None)
        await ch.wait()
        return len(calls), got

    gathered, lines = asyncio.run(main(True))
    control, control_lines = asyncio.run(main(False))
    want = [f"line {i}" for i in range(1500)]
    assert [ln.text for ln in lines] == [ln.text for ln in control_lines] == want
    assert [ln.seq for ln in lines] == list(range(1500))
    assert gathered * 2 < control, (gathered, control)
