"""``python -m bench``: every benchmark suite behind one command.

    python -m bench                          # core-cpu, core-gpu (where a GPU is visible), service, batching
    python -m bench --suite hostile          # memory and slow clients against default settings
    python -m bench --suite core-cpu service # some of them
    python -m bench --quick                  # small grids and short timings: a smoke test

Reports (markdown) and plots (PNG) go to bench/results/, named with the date and
cpu or gpu; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

from bench import batching, core_cpu, core_gpu, hostile, refine_cpu, refine_gpu, service

SUITES = {
    "core-cpu": core_cpu.run,
    "core-gpu": core_gpu.run,
    "service": service.run,
    "batching": batching.run,
    "hostile": hostile.run,
    "refine-cpu": refine_cpu.run,
    "refine-gpu": refine_gpu.run,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--suite",
        nargs="+",
        choices=list(SUITES),
        default=["core-cpu", "core-gpu", "service", "batching"],
        help="suites to run (default: core-cpu, core-gpu where a GPU is visible, service, batching; "
        "hostile, which sends 25 GB of uploads, and refine-* when named)",
    )
    ap.add_argument("--quick", action="store_true", help="small grids and short timings (a smoke test)")
    ap.add_argument("--out", default="bench/results", help="folder for reports and plots ('' for none)")
    args = ap.parse_args(argv)
    out = pathlib.Path(args.out) if args.out else None
    written = []
    for name in args.suite:
        start = time.perf_counter()

        def progress(msg: str, name: str = name, start: float = start) -> None:
            print(f"[{name} {time.perf_counter() - start:6.1f}s] {msg}", file=sys.stderr, flush=True)

        path = SUITES[name](args.quick, out, progress)
        if path is not None:
            written.append(path)
    print("\n".join(f"report: {p}" for p in written), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
