"""Accuracy of the built-in rules' `classify` on the labelled public corpus (read in place)."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from faultwatch.rules import classify, load_ruleset

CORPUS = Path("/work/shared/corpus/public.jsonl")
LABELS = ("retryable", "hardware", "fatal", "hang")


def correct(expected: str, got: str) -> bool:
    """A hang is right when it is neither fatal nor hardware; the others must match."""
    if expected == "hang":
        return got not in ("fatal", "hardware")
    return got == expected


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--rules", nargs="*", default=[], help="extra rule files")
    ap.add_argument("--verbose", action="store_true", help="include the matched line")
    args = ap.parse_args(argv)
    rs = load_ruleset(args.rules)
    cases = [json.loads(x) for x in args.corpus.read_text().splitlines() if x.strip()]
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
            if args.verbose:
                item["line"] = res["line"]
            wrong.append(item)
    print(json.dumps({
        "cases": len(cases), "correct": ok, "accuracy": round(ok / max(1, len(cases)), 4),
        "rules_version": rs.version,
        "confusion": {k: dict(v) for k, v in sorted(confusion.items())},
        "misclassified": wrong,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
