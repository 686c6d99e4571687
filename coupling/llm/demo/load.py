"""Whether a run's timings can be trusted: how much CPU other processes took while it ran.

A speedup is a ratio of wall-clock rates of methods timed one after another. Another process
that takes a core for part of the run slows whichever methods it overlaps, and one run then
shows rules of the same block efficiency from 0.8x to 3x. Linux's ``/proc/stat`` counts the
time every CPU spent busy (steal included: the hypervisor running other machines); this
process's own CPU time (all its threads) comes from :func:`os.times`. Their difference over
the timed runs is the CPU time other processes took, which :func:`verdict` turns into the
``timings_reliable`` flag of the demo's result, with the measured reason.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Snapshot", "snapshot", "other_cores", "verdict", "BUSY_LIMIT"]

#: other processes' mean load, in cores, above which a run's timings are not trusted: a
#: tenth of a core is what an idle shared VM shows (``python -m coupling.llm.demo.load``)
BUSY_LIMIT = 0.1

_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class Snapshot:
    """``wall`` (s, monotonic), ``busy``: CPU seconds every process spent so far (``None``
    where ``/proc/stat`` does not exist), ``own``: this process's CPU seconds."""

    wall: float
    busy: float | None
    own: float


def _busy_seconds(stat: Path = _STAT) -> float | None:
    """Busy CPU seconds of the whole machine: user, nice, system, irq, softirq and steal of
    ``/proc/stat``'s first line (idle and iowait left out; guest time is inside user)."""
    try:
        fields = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def snapshot() -> Snapshot:
    t = os.times()
    return Snapshot(time.monotonic(), _busy_seconds(), t.user + t.system)


def other_cores(a: Snapshot, b: Snapshot) -> float | None:
    """The mean number of cores other processes kept busy between snapshots ``a`` and ``b``
    (``None`` without ``/proc/stat``).

    >>> other_cores(Snapshot(0.0, 100.0, 5.0), Snapshot(10.0, 130.0, 25.0))
    1.0
    """
    if a.busy is None or b.busy is None or b.wall <= a.wall:
        return None
    other = (b.busy - a.busy) - (b.own - a.own)
    return max(other, 0.0) / (b.wall - a.wall)


def verdict(load: float | None, cores: int | None,
            limit: float = BUSY_LIMIT) -> tuple[bool | None, str]:
    """``(timings_reliable, reason)`` for other processes' mean ``load`` in cores.

    >>> verdict(0.9, 2)[0], verdict(0.02, 2)[0], verdict(None, 2)[0]
    (False, True, None)
    """
    if load is None:
        return None, ("not measured: the CPU time of other processes needs Linux's /proc/stat; "
                      "run the demo on an otherwise idle machine")
    of = f" of {cores}" if cores else ""
    if load > limit:
        return False, (f"other processes kept {load:.2f} cores{of} busy on average during the "
                       f"timed runs (limit {limit:g}): the speedups are not trustworthy; rerun "
                       "on an idle machine (docs/llm-demo.md)")
    return True, f"other processes kept {load:.2f} cores{of} busy on average (limit {limit:g})"


if __name__ == "__main__":      # the machine's own background load over five seconds
    first = snapshot()
    time.sleep(5.0)
    print(f"other processes: {other_cores(first, snapshot()):.3f} cores busy on average")
