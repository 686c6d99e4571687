"""Claim (the race through the min cut, ``coupling.rules.optimal.race``): for k i.i.d. drafts
the priority race with the earliest-deadline weights is an optimal coupling:

(a) its laws are the closed forms the package uses: the scheduling functions
    Phi(t) = (b + t)^k - b^k (part A) is convex and D(s) = b^k - (b - s)^k (part B) concave on
    [0, b], so Newton from the left converges monotonically; both equal
    a^(k-1) t sum_{i<k} z^i (z = 1 +- t/a, the cancellation-free form the solver evaluates);
    and k times a piece's integral of a race load is Delta * sum_m g_lo^m g_hi^(k-1-m);
(b) the cut inequalities the scheduling argument rests on hold at the min cut H (tokens by
    p/q decreasing, s = q(H), b = 1 - s): every group J of the lowest-ratio tokens of H has
    Phi(q(J)) <= p(J) (part A's capacity never runs out), and every group J of the
    highest-ratio tokens of H^c has p(J) <= D(q(J)) (part B's demands stay reachable);
(c) with the package's own (float64) weights, the race's law computed in exact rational
    arithmetic over every draft tuple leaves a residual p - loads that is negative nowhere
    beyond float rounding (1e-15: the weights are rounded), so its output law, the residual
    clipped, lies within 1e-15 of p in total variation (lossless to float precision; with
    weights free of rounding the residual is non-negative and the law exactly p, by the
    construction of the residual); its acceptance is the optimum to 1e-12, part B serves
    every token of H^c its p to 1e-12, and the package's closed-form loads equal the exact
    ones to 1e-14.

Source: derived here (coupling/rules/optimal/race.py); the structure of optimal plans through
the cut is coupling/lp/plan.py (proofs/multidraft_cut_plan.py). Thomas & Pal's
exact sampler ("partial resolution", NeurIPS 2025) could not be read (abstract only).

Method: (a) sympy, k = 1..8; (b), (c) exact rational arithmetic (Fractions) on every pair of
laws over V = 3 with probabilities multiples of 1/4, and 40 random dyadic pairs over V = 4
(dyadic so that the float64 laws the package reads are exactly these rationals), k = 2..4
(V = 3) and k = 2, 3 (V = 4); each race law is integrated exactly (piecewise polynomials in
the coin with rational breakpoints). Negative control: equal part-A weights (a uniformly
chosen H-draft wins) must overdraw a token of H by far more than rounding (TV > 1e-3).

Status: (a) proved symbolically; (b), (c) checked exhaustively in exact arithmetic on the
stated instances (the losslessness of the race for any weights with a non-negative residual
is proved in the sampler's module docstring). The earliest-deadline construction itself (that
its weights always give a non-negative residual and meet part B's demands) is argued there and
checked here and in the tests; it is not proved symbolically for every law.
"""

from __future__ import annotations

import itertools
import random
import sys
from fractions import Fraction as F

import numpy as np
import sympy as sp

from coupling.rules.optimal import optimal_acceptance, race_plan
from coupling.rules.optimal.loads import loads_max, loads_min


# ----------------------------------------------------------------------------- (a) symbolic
def symbolic() -> bool:
    t, a, lo, hi, dl = sp.symbols("t a g_lo g_hi Delta", positive=True)
    ok = True
    for k in range(1, 9):
        phi = (a + t) ** k - a**k
        dd = a**k - (a - t) ** k
        ok &= sp.simplify(sp.diff(phi, t, 2) - k * (k - 1) * (a + t) ** max(k - 2, 0)) == 0
        ok &= sp.simplify(sp.diff(dd, t, 2) + k * (k - 1) * (a - t) ** max(k - 2, 0)) == 0
        for sign, G in ((1, phi), (-1, dd)):
            z = 1 + sign * t / a
            ok &= sp.simplify(a ** (k - 1) * t * sum(z**i for i in range(k)) - G) == 0
        # g linear on a piece of width Delta: g_lo - g_hi = beta Delta; k int g^(k-1) over the
        # piece = (g_lo^k - g_hi^k) / beta = Delta * h
        beta = (lo - hi) / dl
        kappa = sp.symbols("kappa")
        integral = k * sp.integrate((lo - beta * kappa) ** (k - 1), (kappa, 0, dl))
        ok &= sp.simplify(integral - dl * sum(lo**m * hi ** (k - 1 - m) for m in range(k))) == 0
    return bool(ok)


# ----------------------------------------------------------------------------- exact cut
def exact_cut(p, q, k) -> tuple[F, list[int], F]:
    """``(OPT, H in ratio order, b)`` by the prefix scan in Fractions."""
    V = len(p)
    key = [(F(10**9) if q[i] == 0 and p[i] > 0 else (p[i] / q[i] if q[i] else F(-1)))
           for i in range(V)]
    order = sorted(range(V), key=lambda i: -key[i])
    best = None
    for m in range(V + 1):
        H, C = order[:m], order[m:]
        b = sum((q[i] for i in C), F(0))
        val = sum((p[i] for i in C), F(0)) + 1 - b**k
        if best is None or val < best[0]:
            best = (val, H, b)
    return best


def cut_inequalities(p, q, k) -> bool:
    _, H, b = exact_cut(p, q, k)
    Hq = [i for i in H if q[i] > 0]
    rest = [i for i in range(len(p)) if i not in H and q[i] > 0 and p[i] > 0]
    tail = sorted(rest, key=lambda i: -(p[i] / q[i])) if b > 0 else []
    for j in range(1, len(Hq) + 1):                  # the j lowest-ratio tokens of H
        J = Hq[-j:]
        qJ, pJ = sum(q[i] for i in J), sum(p[i] for i in J)
        if (b + qJ) ** k - b**k > pJ:
            return False
    for j in range(1, len(tail) + 1):                # the j highest-ratio tokens of H^c
        J = tail[:j]
        qJ, pJ = sum(q[i] for i in J), sum(p[i] for i in J)
        if pJ > b**k - (b - qJ) ** k:
            return False
    return True


# ----------------------------------------------------------------------------- exact race law
def _poly_mul(a: list[F], b: list[F]) -> list[F]:
    out = [F(0)] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            out[i + j] += x * y
    return out


def win_min(W: list[F]) -> list[F]:
    """P(draw j has the smallest key u W): int_0^{t*} prod_{i != j} (1 - W_j/W_i t) dt."""
    out = []
    for j, wj in enumerate(W):
        c = [wj / w for i, w in enumerate(W) if i != j]
        top = min([F(1)] + [1 / x for x in c if x > 0])
        poly = [F(1)]
        for x in c:
            poly = _poly_mul(poly, [F(1), -x])
        out.append(sum(a * top ** (n + 1) / (n + 1) for n, a in enumerate(poly)))
    return out


def win_max(W: list[F | None], theta: F) -> tuple[list[F], F]:
    """P(draw j has the largest key, >= theta) and P(every key < theta); None: silent."""
    live = [w for w in W if w is not None]
    reject = F(1)
    for w in live:
        reject *= min(F(1), theta / w)
    out = []
    for j, wj in enumerate(W):
        if wj is None:
            out.append(F(0))
            continue
        lo = min(F(1), theta / wj)
        c = [wj / w for i, w in enumerate(W) if i != j and w is not None]
        edges = sorted({lo, F(1), *[min(max(1 / x, lo), F(1)) for x in c]})
        total = F(0)
        for a, b in zip(edges[:-1], edges[1:], strict=True):
            lin = [x for x in c if x * (a + b) / 2 < 1]      # factors still linear here
            coef = F(1)
            for x in lin:
                coef *= x
            n = len(lin)
            total += coef * (b ** (n + 1) - a ** (n + 1)) / (n + 1)
        out.append(total)
    return out, reject


def exact_race(pf: np.ndarray, qf: np.ndarray, k: int, *, equal_a: bool = False):
    """``(loads [V] exact, plan)`` of the package's race on float laws (exact rationals)."""
    plan = race_plan(pf, qf, k)
    if equal_a:
        plan.logw_a = np.where(np.isfinite(plan.logw_a), 0.0, plan.logw_a)
    q = [F(float(x)) for x in qf]
    V = len(q)
    wa = [F(float(np.exp(x))) if np.isfinite(x) else None for x in plan.logw_a]
    wb = [F(float(np.exp(x))) if np.isfinite(x) else None for x in plan.logw_b]
    theta = F(float(np.exp(plan.log_theta))) if np.isfinite(plan.log_theta) else F(0)
    loads = [F(0)] * V
    for t in itertools.product(range(V), repeat=k):
        w = F(1)
        for x in t:
            w *= q[x]
        if w == 0:
            continue
        hit = [x for x in t if plan.in_h[x]]
        if hit:
            for x, v in zip(hit, win_min([wa[x] for x in hit]), strict=True):
                loads[x] += w * v
        else:
            win, _ = win_max([wb[x] for x in t], theta)
            for x, v in zip(t, win, strict=True):
                loads[x] += w * v
    return loads, plan


def race_case(pf: np.ndarray, qf: np.ndarray, k: int) -> tuple[bool, bool]:
    """``(verified, skipped)`` for one instance (skipped: weights past float range)."""
    plan = race_plan(pf, qf, k)
    spans = [np.ptp(w[np.isfinite(w)]) for w in (plan.logw_a, plan.logw_b)
             if np.isfinite(w).any()]
    if spans and max(spans) > 700:
        return True, True
    loads, plan = exact_race(pf, qf, k)
    p = [F(float(x)) for x in pf]
    rest = [a - b for a, b in zip(p, loads, strict=True)]
    opt, _, _ = exact_cut(p, [F(float(x)) for x in qf], k)
    ok = min(rest) > -1e-15 and output_tv(p, loads) < 1e-15
    ok &= abs(float(sum(loads) - opt)) < 1e-12
    ok &= all(abs(float(r)) < 1e-12 for r, h in zip(rest, plan.in_h, strict=True) if not h)
    closed = loads_min(qf, plan.logw_a, k) + loads_max(qf, plan.logw_b, k, plan.log_theta,
                                                       ~plan.in_h)
    ok &= float(np.abs(closed - np.array([float(x) for x in loads])).max()) < 1e-14
    ok &= abs(float(opt) - optimal_acceptance(pf, qf, k)) < 1e-12
    return bool(ok), False


def output_tv(p: list[F], loads: list[F]) -> F:
    """Exact TV to ``p`` of the race's output law: the loads, and the rejected mass
    ``1 - sum(loads)`` spread over the residual ``(p - loads)_+``."""
    plus = [max(a - b, F(0)) for a, b in zip(p, loads, strict=True)]
    reject, total = 1 - sum(loads), sum(plus)
    out = [b + (reject * r / total if total else 0) for b, r in zip(loads, plus, strict=True)]
    return sum(abs(a - b) for a, b in zip(out, p, strict=True)) / 2


def grid(V: int, N: int):
    for c in itertools.product(range(N + 1), repeat=V - 1):
        if sum(c) <= N:
            yield np.array([x / N for x in c] + [(N - sum(c)) / N])


def main() -> int:
    ok = symbolic()
    print("symbolic (convexity, cancellation-free form, piece integrals; k = 1..8):", ok)
    cases = [(p, q, k) for p in grid(3, 4) for q in grid(3, 4) for k in (2, 3, 4)]
    rnd = random.Random(1)
    for _ in range(40):            # dyadic laws: multiples of 1/64, exact in float64
        a, b = [rnd.randint(0, 21) for _ in range(3)], [rnd.randint(0, 21) for _ in range(3)]
        for k in (2, 3):
            cases.append((np.array(a + [64 - sum(a)]) / 64, np.array(b + [64 - sum(b)]) / 64, k))
    n = skipped = 0
    for pf, qf, k in cases:
        good = cut_inequalities([F(float(x)) for x in pf], [F(float(x)) for x in qf], k)
        verified, skip = race_case(pf, qf, k)
        if not (good and verified):
            print("FAILED on", pf.tolist(), qf.tolist(), k)
            ok = False
        n += 1
        skipped += skip
    print(f"exact cut inequalities and exact race laws: {n} instances ({skipped} skipped: "
          "weights past float range)")
    p, q = np.array([247, 1, 558, 218]) / 1024, np.array([94, 317, 405, 208]) / 1024
    loads, plan = exact_race(p, q, 3, equal_a=True)
    bad = output_tv([F(float(x)) for x in p], loads)
    print(f"negative control (equal part-A weights): exact TV to p {float(bad):.3g} (must be "
          "> 1e-3)")
    ok &= bad > 1e-3
    print("optimal_race_sampler:", "VERIFIED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
