"""Groups a rank's Python traceback or C++ `terminate called ... what():` lines into one block."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

TB_START = "Traceback (most recent call last):"
CPP_START = "terminate called after throwing an instance of"
CHAIN_MARKERS = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
# `RuntimeError: msg`, `torch.distributed.DistStoreError: msg`, `KeyboardInterrupt`
EXC_LINE = re.compile(r"[A-Za-z_][\w.]*(?:: |:$|$)")
BOX_PREFIX = re.compile(r"\s*[|+][-+]*\s?")
CONTEXT_LINES = 50
MAX_BLOCK_LINES = 5000
CPP_SLACK = 8  # message lines allowed between what() and "Exception raised from"


@dataclass(slots=True)
class Block:
    """Segment indices of one traceback; `report` is its final exception (or what()) line."""

    rank: int | None
    members: list[int]
    finals: list[int]
    report: int | None


def _is_final(text: str, group: bool = False) -> bool:
    if not text:
        return False
    if text[0] in " \t":
        if not group:
            return False
        m = BOX_PREFIX.match(text)  # an exception group box line: "    | ValueError: x"
        if m is None or "|" not in m.group(0):
            return False
        text = text[m.end():]
        if not text or text[0] in " \t":
            return False
    return EXC_LINE.match(text) is not None and not text.startswith(("File ", "Traceback"))


def _python_block(texts: Sequence[str], ranks: Sequence[int | None], s: int) -> Block:
    rank = ranks[s]
    blk = Block(rank, [s], [], None)
    pending: list[int] = []
    in_frames = True
    group = "Exception Group" in texts[s]
    for i in range(s + 1, min(len(texts), s + MAX_BLOCK_LINES)):
        if ranks[i] != rank:
            continue
        t = texts[i]
        if group and t[:1] not in (" ", "\t"):
            break
        if in_frames:
            if _is_final(t, group) and not t.startswith(CHAIN_MARKERS):
                blk.members.append(i)
                blk.finals.append(i)
                in_frames = t[0] in " \t"  # inside an exception group box: keep going
                continue
            if not t.strip() or t[0] in " \t^~" or TB_START in t or t.startswith(CHAIN_MARKERS):
                blk.members.append(i)
                continue
            break
        if not t.strip():
            pending.append(i)
            continue
        if t.startswith(CHAIN_MARKERS) or TB_START in t or t[0] in " \t" and "|" in t[:40]:
            blk.members.extend(pending)
            blk.members.append(i)
            pending.clear()
            in_frames = True
            if _is_final(t, group):
                blk.finals.append(i)
            continue
        break
    blk.report = blk.finals[-1] if blk.finals else None
    return blk


def _cpp_block(texts: Sequence[str], ranks: Sequence[int | None], s: int) -> Block:
    rank = ranks[s]
    blk = Block(rank, [s], [], None)
    tentative: list[int] = []
    for i in range(s + 1, min(len(texts), s + MAX_BLOCK_LINES)):
        if ranks[i] != rank:
            continue
        t = texts[i]
        if blk.report is None:
            if "what():" in t:
                blk.members.append(i)
                blk.report = i
                blk.finals.append(i)
                continue
            break
        if TB_START in t or CPP_START in t:
            break
        if t.startswith(("frame #", "Exception raised from")):
            blk.members.extend(tentative)
            tentative.clear()
            blk.members.append(i)
            continue
        if len(tentative) < CPP_SLACK:
            tentative.append(i)
            continue
        break
    # message lines right after what() (no frames followed) still belong to the error
    for i in tentative[:3]:
        if texts[i].strip() and not texts[i].startswith(("[", "Fatal Python")):
            blk.members.append(i)
        else:
            break
    blk.members.sort()
    return blk


def find_blocks(texts: Sequence[str], ranks: Sequence[int | None],
                starts: Sequence[int]) -> list[Block]:
    """The blocks that begin at the given segment indices (sorted), per rank, no overlaps."""
    blocks: list[Block] = []
    covered: set[int] = set()
    for s in starts:
        if s in covered:
            continue
        t = texts[s]
        blk = _cpp_block(texts, ranks, s) if CPP_START in t else _python_block(texts, ranks, s)
        covered.update(blk.members)
        blocks.append(blk)
    return blocks
