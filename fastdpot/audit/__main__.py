"""``python -m fastdpot.audit``: audit every release of fastdpot on every available backend and print a table.

Exits with status 1 when any audited lower bound exceeds the claimed ε (a refuted claim), 0 otherwise.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import List, Optional

from .run import backend_status, run_case


def _parser() -> argparse.ArgumentParser:
    from .cases import CASES, VARIANTS

    p = argparse.ArgumentParser(prog="python -m fastdpot.audit", description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=None,
                   help="releases per input for every case (default: each case's own, see fastdpot.audit.cases)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generator every release draws from")
    p.add_argument("--cases", nargs="+", choices=sorted(CASES), default=None, help="cases to run (default: all)")
    p.add_argument("--backends", nargs="+", choices=("reference", "cpu", "triton"), default=None,
                   help="backends to run (default: every available one)")
    p.add_argument("--variant", choices=VARIANTS + ("no_sampling",), default="correct",
                   help="audit a deliberately broken variant instead (a negative control; it should be caught)")
    p.add_argument("--confidence", type=float, default=0.95)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    from .cases import CASES

    args = _parser().parse_args(argv)
    rows, violated = [], False
    for name in args.cases or list(CASES):
        case = CASES[name]
        if args.variant not in case.variants:
            continue
        for backend in case.backends:
            if args.backends is not None and backend not in args.backends:
                continue
            ok, reason = backend_status(name, backend)
            if not ok:
                rows.append((name, backend, "-", "-", "-", f"skipped: {reason}"))
                continue
            t0 = time.perf_counter()
            r = run_case(name, backend, args.variant, trials=args.trials, seed=args.seed, confidence=args.confidence)
            violated |= r.violated
            verdict = "VIOLATED" if r.violated else "ok"
            rows.append((name, backend, f"({r.epsilon:.3g}, {r.delta:.0e})", f"{r.epsilon_lower:.3f}", str(r.trials),
                         f"{verdict} ({time.perf_counter() - t0:.1f} s)"))
    head = ("mechanism", "backend", "claimed (ε, δ)", "audited ε ≥", "trials", "verdict")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    print(f"fastdpot privacy audit: variant={args.variant}, seed={args.seed}, confidence={args.confidence}")
    print(line(head))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))
    return 1 if violated else 0


if __name__ == "__main__":
    sys.exit(main())
