"""Run every proof in this folder; exit non-zero if any claim fails to verify.

Each ``proofs/<claim>.py`` is a standalone script that exits 0 iff its claim is
verified. See ``proofs/README.md`` for the list of claims and their status.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    scripts = sorted(
        p for p in HERE.glob("*.py") if p.name != "run_all.py" and not p.name.startswith("_")
    )
    failed = []
    for script in scripts:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
        dt = time.perf_counter() - t0
        status = "verified" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
        print(f"{script.name:<40} {status:<22} {dt:6.1f} s")
        if proc.returncode != 0:
            failed.append(script.name)
            sys.stdout.write(proc.stdout[-4000:])
            sys.stderr.write(proc.stderr[-4000:])
    print(f"proofs: {len(scripts) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed or not scripts else 0


if __name__ == "__main__":
    sys.exit(main())
