"""Run every benchmark script in this folder, one process each (``make bench``).

Each script prints its own table with ratios against a baseline measured in the same
process; docs/RESULTS.md records the numbers with the command that produced them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    scripts = sorted([*HERE.glob("bench_*.py"), *HERE.glob("compare_*.py")])
    if argv:
        scripts = [s for s in scripts if any(a in s.name for a in argv)]
    rc = 0
    for script in scripts:
        print(f"\n===== {script.name} =====", flush=True)
        rc |= subprocess.call([sys.executable, str(script)])
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
