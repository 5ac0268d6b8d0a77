"""What the divergence loss scan (faultwatch/rules/loss.py) costs the matcher: the same
synthetic training log as bench/matcher_throughput.py (Megatron iteration lines, tqdm bars,
HF dicts: ~42 % of its lines print a loss) through Matcher.match_lines with the loss scan on
and off (policy divergence_detection), interleaved in the same run, batches of 500 lines.
Prints each pair and the median time ratio on/off.

    PYTHONPATH=$PWD .venv/bin/python bench/loss_scan.py [--lines N] [--repeat R]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from bench.matcher_throughput import gen_lines, run_matcher
from faultwatch.rules import load_ruleset
from faultwatch.rules.engine import Matcher


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    rs = load_ruleset()
    on = Matcher(rs)
    off = Matcher(dataclasses.replace(rs, policy={**rs.policy, "divergence_detection": False}))
    texts = gen_lines(a.lines)
    print(f"{sum('loss' in t.lower() for t in texts)} of {len(texts)} lines print a loss")
    ratios = []
    for _ in range(a.repeat):
        t_off = run_matcher(off, texts, 500)[0]
        t_on = run_matcher(on, texts, 500)[0]
        ratios.append(t_on / t_off)
        print(f"off {t_off:.3f} s  on {t_on:.3f} s  ratio {t_on / t_off:.3f}")
    print(f"median time ratio on/off: {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
