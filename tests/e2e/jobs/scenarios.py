"""Plain-Python training stand-ins for detector tests (no torch: fast), chosen by argv[1].

steady N STEP_S      N steps, then exit 0
stall K STEP_S       K steps, then warnings forever, no step advances
checkpoint K STEP_S CKPT_S   K steps, a silent checkpoint of CKPT_S, K more steps, exit 0
silent K STEP_S      K steps, then silence forever (a hang)
forever STEP_S       steps until killed
fail MSG             print an error line, exit 1
"""

import sys
import time


def steps(start: int, n: int, step_s: float) -> None:
    for i in range(start, start + n):
        print(f"step {i} loss {1.0 / (i + 1):.4f}", flush=True)
        time.sleep(step_s)


def main() -> None:
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "steady":
        steps(0, int(args[0]), float(args[1]))
    elif mode == "stall":
        steps(0, int(args[0]), float(args[1]))
        while True:
            print("NCCL WARN Call to ibv_reg_mr failed, retrying", flush=True)
            time.sleep(float(args[1]))
    elif mode == "checkpoint":
        k, step_s, ckpt_s = int(args[0]), float(args[1]), float(args[2])
        steps(0, k, step_s)
        print(f"saving checkpoint at iteration {k} to /ckpt", flush=True)
        time.sleep(ckpt_s)
        print(f"successfully saved checkpoint at iteration {k} to /ckpt", flush=True)
        steps(k, k, step_s)
    elif mode == "silent":
        steps(0, int(args[0]), float(args[1]))
        time.sleep(3600)
    elif mode == "forever":
        steps(0, 10**9, float(args[0]))
    elif mode == "fail":
        print("warming up", flush=True)
        time.sleep(0.3)
        print(args[0], file=sys.stderr, flush=True)
        sys.exit(1)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
