"""Run every proof in this folder; exit non-zero if any claim fails to verify.

Each ``proofs/<claim>.py`` is a standalone script that exits 0 iff its claim is
verified. See ``proofs/README.md`` for the list of claims and their status.

The scripts run as independent processes, as many at once as the machine has cores
(``--jobs`` to choose): each is single-threaded sympy or exact-rational code.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(script: Path) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    return proc, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="proofs run at once (default: the number of cores)")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs {args.jobs}: must be >= 1")
    scripts = sorted(
        p for p in HERE.glob("*.py") if p.name != "run_all.py" and not p.name.startswith("_")
    )
    failed = []
    with ThreadPoolExecutor(args.jobs) as pool:
        for script, (proc, dt) in zip(scripts, pool.map(run, scripts), strict=True):
            status = "verified" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
            print(f"{script.name:<40} {status:<22} {dt:6.1f} s", flush=True)
            if proc.returncode != 0:
                failed.append(script.name)
                sys.stdout.write(proc.stdout[-4000:])
                sys.stderr.write(proc.stderr[-4000:])
    print(f"proofs: {len(scripts) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed or not scripts else 0


if __name__ == "__main__":
    sys.exit(main())
