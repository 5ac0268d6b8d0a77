"""Accuracy of the built-in rules' `classify` on labelled failure logs: the shared public corpus
(read in place), our own held-out corpus (bench/corpus/heldout.jsonl) and our held-out set of
real hardware failure logs (bench/corpus/heldout_hardware.jsonl, and heldout_hardware_late.jsonl
collected after the hardware rules were written), per class."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from faultwatch.rules import classify, load_ruleset
from faultwatch.rules.model import RuleSet

PUBLIC = Path("/work/shared/corpus/public.jsonl")
HELDOUT = Path(__file__).parent / "corpus" / "heldout.jsonl"
HELDOUT_HARDWARE = Path(__file__).parent / "corpus" / "heldout_hardware.jsonl"
HELDOUT_HARDWARE_LATE = Path(__file__).parent / "corpus" / "heldout_hardware_late.jsonl"
LABELS = ("retryable", "hardware", "fatal", "hang")


def correct(expected: str, got: str) -> bool:
    """A hang is right when it is neither fatal nor hardware; the others must match."""
    if expected == "hang":
        return got not in ("fatal", "hardware")
    return got == expected


def evaluate(rs: RuleSet, path: Path, verbose: bool = False) -> dict[str, Any]:
    """Accuracy, per-class accuracy and confusion (expected -> got -> count) on one corpus."""
    cases = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    confusion: dict[str, Counter[str]] = defaultdict(Counter)
    wrong = []
    ok = 0
    for c in cases:
        res = classify(rs, c["log"], c.get("exit_code"))
        got = str(res["category"])
        confusion[c["category"]][got] += 1
        if correct(c["category"], got):
            ok += 1
        else:
            item = {"id": c["id"], "expected": c["category"], "got": got, "rule": res["rule"]}
            if verbose:
                item["line"] = res["line"]
            wrong.append(item)
    per_class = {}
    for label, row in sorted(confusion.items()):
        n = sum(row.values())
        right = sum(k for g, k in row.items() if correct(label, g))
        per_class[label] = f"{right}/{n}"
    return {
        "corpus": str(path), "cases": len(cases), "correct": ok,
        "accuracy": round(ok / max(1, len(cases)), 4), "per_class": per_class,
        "confusion": {k: dict(v) for k, v in sorted(confusion.items())},
        "misclassified": wrong,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--corpus", type=Path, action="append",
                    help=f"a labelled .jsonl (repeatable; default: {PUBLIC}, {HELDOUT}, "
                         f"{HELDOUT_HARDWARE}, {HELDOUT_HARDWARE_LATE})")
    ap.add_argument("--rules", nargs="*", default=[], help="extra rule files")
    ap.add_argument("--verbose", action="store_true", help="include the matched line")
    args = ap.parse_args(argv)
    rs = load_ruleset(args.rules)
    paths = args.corpus or [p for p in (PUBLIC, HELDOUT, HELDOUT_HARDWARE, HELDOUT_HARDWARE_LATE)
                            if p.exists()]
    print(json.dumps({"rules_version": rs.version,
                      "sets": [evaluate(rs, p, args.verbose) for p in paths]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
