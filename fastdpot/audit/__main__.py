"""``python -m fastdpot.audit``: audit every release of fastdpot on every available backend, test the tails of every
noise source, and print both tables and what the audit cannot detect.

Exits with status 1 when any audited lower bound exceeds the claimed ε (a refuted claim) or a noise source is
flagged by the tail test, 0 otherwise. Progress goes to stderr (tqdm), the tables to stdout, and the picture of the
audited lower bounds against the claimed ε (:func:`fastdpot.plot.audit`) to ``--plot`` (``python -m fastdpot.audit``
writes ``audit.png`` in the working directory unless ``--plot ''``; it needs matplotlib, the ``plot`` extra, and
says so on stderr when it is missing).
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import List, Optional

from .run import backend_status, run_case

#: printed under the tables: what an "ok" does NOT establish (docs/audit.md, "What the audit cannot detect")
CANNOT_DETECT = """\
What this audit cannot detect (an "ok" is a lower bound that stayed below the claim, not a proof of privacy):
* Secrecy of the randomness: the release cases run replayable (seeded) so that they repeat; a leaked, predictable
  or stored seed, or noise that repeats across runs, passes them. (The tail test draws the secure sources.)
* Truncation of the noise beyond what the draws resolve: the tail test sees a cut at or below about 4 sigma
  (10^6 draws); float32 torch.randn's 5.77 sigma cap (tail mass 1.2e-8) would need 10^9 draws, the C++ kernels'
  8.9 sigma reach is beyond any sampling test (argued in docs/privacy.md), and a release audit of 10^5 trials sees
  only cuts near 3 sigma.
* Sensitivity errors smaller than the trials resolve (about 2x at 4e5 trials with a fixed worst direction; over
  random directions even 2x hides: random_theta), and accounting errors over many steps (the composition case has
  T = 4 releases).
* Floating-point attacks on the noise (Mironov, CCS 2012), timing and other side channels, and hyper-parameters
  chosen on private data.
"""


def _parser(plot_default: Optional[str] = None) -> argparse.ArgumentParser:
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
    p.add_argument("--tail-draws", type=int, default=10 ** 6,
                   help="normals drawn per noise source by the tail test (0: skip it)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--plot", default=plot_default, metavar="PATH",
                   help="write the picture of the audited lower bounds against the claimed ε there (PNG; '' for "
                        f"none; default: {plot_default!r})")
    return p


def _jobs(args, CASES):
    jobs = []
    for name in args.cases or list(CASES):
        case = CASES[name]
        if args.variant not in case.variants:
            continue
        jobs += [(name, b) for b in case.backends if args.backends is None or b in args.backends]
    return jobs


def _table(head, rows) -> List[str]:
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows]


def _tail_rows(args, bar) -> tuple:
    from .._ext import BackendUnavailableError
    from .tails import NOISE_SOURCES, run_tail_case

    rows, flagged = [], False
    variant = "truncated" if args.variant == "truncated" else "correct"
    for source in NOISE_SOURCES:
        bar.set_description(f"tails {source}")
        t0 = time.perf_counter()
        try:
            r = run_tail_case(source, variant, draws=args.tail_draws)
        except BackendUnavailableError as err:
            rows.append((source, "-", "-", "-", f"skipped: {err}"))
        else:
            flagged |= r.flagged
            rows.append((source, str(r.draws), " ".join(f"{o}/{e:.0f}" for o, e in zip(r.observed, r.expected)),
                         f"{r.p_value:.2g}", f"{'FLAGGED' if r.flagged else 'ok'} ({time.perf_counter() - t0:.1f} s)"))
        bar.update(1)
    return rows, flagged


def _write_plot(path: str, results) -> None:
    """The audited cases' picture at ``path`` (:func:`fastdpot.plot.audit`); a note on stderr when nothing to draw
    or matplotlib is missing."""
    if not results:
        print(f"no audited case to draw: {path} not written", file=sys.stderr)
        return
    try:
        from ..plot import audit as plot_audit

        plot_audit(results, path=path)
    except ImportError as err:
        print(f"no picture: {err}", file=sys.stderr)
        return
    print(f"wrote {path}")


def main(argv: Optional[List[str]] = None, *, plot_default: Optional[str] = None) -> int:
    """The command line (module docstring); ``plot_default`` is ``--plot``'s default (``python -m fastdpot.audit``:
    ``audit.png``; a call from Python: None, no picture unless ``--plot`` is given). Returns the exit status."""
    from .._progress import progress_bar
    from .cases import CASES
    from .tails import NOISE_SOURCES, TAIL_THRESHOLDS

    args = _parser(plot_default).parse_args(argv)
    jobs = _jobs(args, CASES)
    tails = args.tail_draws > 0 and args.variant in ("correct", "truncated")
    bar = progress_bar(total=len(jobs) + (len(NOISE_SOURCES) if tails else 0), desc="audit",
                       disable=args.no_progress, file=sys.stderr)
    rows, violated, audited = [], False, []
    for name, backend in jobs:
        bar.set_description(f"{name} [{backend}]")
        ok, reason = backend_status(name, backend)
        if not ok:
            rows.append((name, backend, "-", "-", "-", f"skipped: {reason}"))
            bar.update(1)
            continue
        t0 = time.perf_counter()
        r = run_case(name, backend, args.variant, trials=args.trials, seed=args.seed, confidence=args.confidence)
        violated |= r.violated
        audited.append((f"{name} [{backend}]", r))
        verdict = "VIOLATED" if r.violated else "ok"
        rows.append((name, backend, f"({r.epsilon:.3g}, {r.delta:.0e})", f"{r.epsilon_lower:.3f}", str(r.trials),
                     f"{verdict} ({time.perf_counter() - t0:.1f} s)"))
        bar.update(1)
    tail_rows, flagged = _tail_rows(args, bar) if tails else ([], False)
    bar.close()
    print(f"fastdpot privacy audit: variant={args.variant}, seed={args.seed}, confidence={args.confidence}")
    if rows:
        print("\n".join(_table(("mechanism", "backend", "claimed (ε, δ)", "audited ε ≥", "trials", "verdict"), rows)))
    if tail_rows:
        print(f"\nnoise tails (|Z| > {', '.join(f'{t:g}' for t in TAIL_THRESHOLDS)} σ: observed/expected; "
              f"one-sided binomial p-value, Bonferroni; flagged below 1e-4"
              f"{'; every source cut at 3σ: each must be FLAGGED' if args.variant == 'truncated' else ''})")
        print("\n".join(_table(("noise source", "draws", "observed/expected", "p-value", "verdict"), tail_rows)))
    print()
    print(CANNOT_DETECT, end="")
    if args.plot:
        _write_plot(args.plot, audited)
    return 1 if violated or flagged else 0


if __name__ == "__main__":
    sys.exit(main(plot_default="audit.png"))
