"""Spool: framing, replay, corrupt records, acks releasing segments, the size cap."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from faultwatch.agents.spool import KEEP, LIFECYCLE, Spool, SpoolError


def test_append_read_ack_releases_segments(tmp_path: Path) -> None:
    sp = Spool(tmp_path, cap_bytes=1 << 20, segment_bytes=4096)
    recs = [sp.append(b"k", b"v%d" % i * 50, nlines=2) for i in range(200)]
    assert [r.id for r in recs] == list(range(200))
    assert len(list(tmp_path.glob("*.seg"))) > 2
    got = sp.read(0, max_records=1000)
    assert [r.value for r in got] == [r.value for r in recs]
    assert [r.id for r in sp.read(150, 10)] == list(range(150, 160))
    for r in recs:
        sp.ack(r.id)
    assert sp.pending == 0
    sp.close()
    assert not list(tmp_path.glob("*.seg"))


def test_replay_after_crash_and_corrupt_record_skipped(tmp_path: Path) -> None:
    sp = Spool(tmp_path)
    for i in range(10):
        sp.append(b"job/n", b"record %d" % i, nlines=1)
    sp.ack(0)  # persisted at once (the first watermark write is not delayed)
    # simulate SIGKILL: no close(); corrupt one record's payload in the file
    seg = next(tmp_path.glob("*.seg"))
    data = bytearray(seg.read_bytes())
    pos = data.index(b"record 4")
    data[pos] = ord("X")
    seg.write_bytes(bytes(data) + b"FWS1torn")  # and a torn write at the tail
    os.close(sp._lock_fd)  # the killed process' lock goes away with it
    sp2 = Spool(tmp_path)
    assert sp2.stats.corrupt == 2
    vals = [r.value for r in sp2.read(sp2.first_pending_id, 100)]
    assert vals == [b"record %d" % i for i in range(1, 10) if i != 4]  # 0 was acked
    assert sp2.stats.skipped_acked == 1
    assert sp2.next_id == 10
    assert sp2.append(b"job/n", b"new").id == 10


def test_second_agent_on_same_spool_is_refused(tmp_path: Path) -> None:
    sp = Spool(tmp_path)
    with pytest.raises(SpoolError, match="in use"):
        Spool(tmp_path)
    sp.close()
    Spool(tmp_path).close()


def test_cap_drops_oldest_ordinary_first(tmp_path: Path) -> None:
    sp = Spool(tmp_path, cap_bytes=64 * 1024, segment_bytes=8 * 1024)
    payload = b"x" * 1000
    kinds = {}
    for i in range(200):
        flags = KEEP if i % 10 == 0 else LIFECYCLE if i % 10 == 1 else 0
        r = sp.append(b"k", payload, flags=flags, nlines=5)
        kinds[r.id] = flags
    assert sp.size_bytes <= 64 * 1024 + 8 * 1024
    recs, lines, kept = sp.take_drops()
    assert recs > 0 and lines == 5 * recs and kept == 0
    left = list(sp.iter_all())
    ids = [r.id for r in left]
    # every KEEP / LIFECYCLE record survived; dropped ones are the oldest ordinary
    assert all(i in ids for i, f in kinds.items() if f)
    ordinary_left = [i for i in ids if not kinds[i]]
    dropped = [i for i, f in kinds.items() if not f and i not in ids]
    assert max(dropped) < min(ordinary_left)
    assert sp.take_drops() == (0, 0, 0)


def test_cap_never_drops_what_the_delivery_already_took(tmp_path: Path) -> None:
    sp = Spool(tmp_path, cap_bytes=32 * 1024, segment_bytes=4 * 1024)
    sp.protect_below = 10**9
    for _ in range(100):
        sp.append(b"k", b"y" * 1000)
    assert sp.take_drops() == (0, 0, 0)  # all in flight: over the cap rather than lost


def test_ack_watermark_survives_a_kill_and_ids_never_go_back(tmp_path: Path) -> None:
    sp = Spool(tmp_path, segment_bytes=4096)
    for i in range(50):
        sp.append(b"k", b"r%03d" % i + b"x" * 200, nlines=1)
    for i in (0, 1, 2, 4, 5):  # 3 still in flight: the watermark stops at 2
        sp.ack(i)
    assert sp.acked_upto == 2
    sp._persist_watermark(force=True)
    os.close(sp._lock_fd)  # SIGKILL: no close()
    sp2 = Spool(tmp_path)
    ids = [r.id for r in sp2.read(sp2.first_pending_id, 100)]
    assert ids == list(range(3, 50))  # 4 and 5 are resent (they were above the gap)
    for i in ids:
        sp2.ack(i)
    sp2.close()
    sp3 = Spool(tmp_path)
    assert sp3.pending == 0 and sp3.append(b"k", b"new").id == 50  # no id reuse


def test_full_segments_are_fsynced_by_the_delivery_side_not_by_append(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    sp = Spool(tmp_path, segment_bytes=4096)
    for _ in range(100):  # the control: without defer_sync, append fsyncs each full segment
        sp.append(b"k", b"x" * 200)
    assert len(synced) >= 3
    synced.clear()
    sp.defer_sync = True
    for _ in range(100):
        sp.append(b"k", b"x" * 200)
    assert synced == []  # the appending thread never waited on the disk
    fds = sp.take_sync_fds()
    assert len(fds) >= 4  # the full segments and the active one
    for fd in fds:
        os.fsync(fd)
        os.close(fd)
    assert sp.take_sync_fds() == []
    for _ in range(40):
        sp.append(b"k", b"x" * 200)
    sp.close()  # what was not handed over yet is synced at the close
    assert len(synced) >= len(fds) + 1
    assert sum(1 for _ in Spool(tmp_path).iter_all()) == 240
