"""The hang evaluation matrix (docs/hangs.md): real torchrun jobs under `faultwatch run`, healthy
silences and real hangs side by side; prints one JSON object per scenario, then a table.

    PYTHONPATH=. .venv/bin/python bench/hang_matrix.py [--silence-alone] [--only NAME ...]
        [--framework plain|trainer|lightning ...]

Frameworks: plain (a DDP loop), trainer (Hugging Face Trainer), lightning (Lightning Trainer);
NAME is a scenario name (every framework's) or framework:name.

--silence-alone runs the healthy silences with `hang_needs_evidence: false` (the rule before
issue 22: the learned window decides on silence alone), each in a job of its own (a false hang
ends its job); --both runs the full matrix and then that peer."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.hang_matrix import FRAMEWORKS, SCENARIOS, run_matrix, table  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--silence-alone", action="store_true",
                    help="learned windows decide on silence alone (hang_needs_evidence: false)")
    ap.add_argument("--both", action="store_true", help="the matrix with and without evidence")
    ap.add_argument("--only", nargs="*", default=None,
                    help="scenario names (save) or framework:name (trainer:save)")
    ap.add_argument("--framework", nargs="*", default=None, choices=sorted(FRAMEWORKS),
                    help="only these frameworks")
    ap.add_argument("--keep", type=Path, default=None,
                    help="keep each job's output and decisions under this directory")
    args = ap.parse_args()
    chosen = tuple(s for s in SCENARIOS
                   if (args.only is None or s.name in args.only or s.key in args.only)
                   and (args.framework is None or s.framework in args.framework))
    modes = [True, False] if args.both else [not args.silence_alone]
    ok = True
    for needs in modes:
        if not needs and args.only is None:  # the hangs are decided either way
            chosen = tuple(s for s in chosen if s.expected == "no action")
        label = "evidence" if needs else "silence alone"
        if args.keep is not None:
            rows = run_matrix(args.keep / label.replace(" ", "-"), chosen, needs_evidence=needs)
        else:
            with tempfile.TemporaryDirectory(prefix="hang-matrix-") as tmp:
                rows = run_matrix(Path(tmp), chosen, needs_evidence=needs)
        for r in rows:
            print(json.dumps({"mode": label, **{k: v for k, v in r.items()
                                                if k != "output_tail"}}))
        print(f"\n{label}:\n{table(rows)}\n")
        ok = ok and (all(r["ok"] for r in rows) if needs else True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
