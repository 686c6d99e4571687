"""Claim: the single-path verification of Hierarchical Speculative Decoding's public code is not
lossless: on a context-free pair over V = 2 with gamma = 2, the law of the first two emitted
tokens is 3/25 in total variation from the target's.

The claim under test (Zhou et al., arXiv:2601.05724, abstract): HSD is "a provably lossless
verification method". Its public code (github.com/ZhouYuxuanYX/Hierarchical-Speculative-Decoding,
``transformers/generation/utils.py``, ``_speculative_sampling(backward=True)`` with one draft,
the configuration its README runs as "HSD (clever)") verifies a drafted path x_1..x_gamma as
follows, with p_k, q_k the laws of the k-th token (0-indexed) after x_<k:

* the prefix laws ``Q_k = prod_{j<k} q_j(x_j)``, ``P_k = prod_{j<k} p_j(x_j)``, their ratio capped
  below by 1 and its running maximum ``M_k = max(1, max_{j<=k} P_j / Q_j)``;
* ``plus_k = (P_k / M_k p_k - Q_k q_k)_+``, ``minus_k`` its negative part, and the chance not
  to step back at k, ``a_k = sum plus_k / max(sum plus_k, sum minus_k)``;
* the whole path is accepted (with the bonus token from p_gamma) iff a uniform is at most
  ``prod_k p_k(x_k) / q_k(x_k)``;
* otherwise independent Bernoulli(a_k) draws pick ``s``, the last position that does not step
  back (0 if none); x_<s is emitted and a token from plus_s / sum plus_s.

This is the law :func:`hsd_law` computes in exact rationals. The script checks it against the
code itself, run line for line in torch (its ``a_k``, ``plus_k`` and joint ratio on every drafted
path of the instance), then the counterexample. The paper's own text was not read here (only its
abstract and its code are public in the stored material); its proof may assume something the
code does not do.

Instance: p = (1/5, 4/5) and q = (4/5, 1/5) at every position. A drafted x_1 = 1 has ratio 4, so
every path starting with 1 is accepted whole, and its second token comes out with the draft's
law q instead of the target's p: P(first two = (1, 0)) = 7/25 against 4/25. The first token's
law is exactly p, and gamma = 1 is exactly speculative sampling (checked), so V = 2, gamma = 2 is
the smallest case.

Status: verified (exact rationals; the code cross-check in float64).
"""

from __future__ import annotations

import itertools
import sys
from fractions import Fraction as F


def hsd_law(x: tuple[int, ...], p: list[list[F]], q: list[list[F]]) -> dict[tuple, F]:
    """{emitted tokens: probability} of one call on the drafted path ``x`` (module doc);
    ``p`` has gamma + 1 rows, ``q`` gamma."""
    g, V = len(x), len(p[0])
    qi = [q[k][x[k]] for k in range(g)]
    pi = [p[k][x[k]] for k in range(g)]
    a, plus = [], []
    Pk, Qk, M = F(1), F(1), F(1)
    for k in range(g):
        M = max(M, max(F(1), Pk / Qk))
        row = [Pk / M * p[k][y] - Qk * q[k][y] for y in range(V)]
        pl = [max(r, F(0)) for r in row]
        mi = [max(-r, F(0)) for r in row]
        den = max(sum(pl), sum(mi))
        a.append(sum(pl) / den if den > 0 else F(0))
        plus.append(pl)
        Pk, Qk = Pk * pi[k], Qk * qi[k]
    R = F(1)
    for k in range(g):
        R *= pi[k] / qi[k]
    out: dict[tuple, F] = {}
    full = min(F(1), R)
    for y in range(V):
        out[x + (y,)] = out.get(x + (y,), F(0)) + full * p[g][y]
    for s in range(g):
        ps = F(1)
        for j in range(s + 1, g):
            ps *= 1 - a[j]
        ps = ps * (a[s] if s > 0 else F(1))
        if sum(plus[s]) == 0 or ps == 0:
            continue
        for y in range(V):
            w = (1 - full) * ps * plus[s][y] / sum(plus[s])
            if w:
                out[x[:s] + (y,)] = out.get(x[:s] + (y,), F(0)) + w
    return out


def first_call(p1: list[F], q1: list[F], g: int) -> dict[tuple, F]:
    """The law of one call's emission on a context-free pair, every drafted path weighted."""
    V = len(p1)
    law: dict[tuple, F] = {}
    for x in itertools.product(range(V), repeat=g):
        w = F(1)
        for t in x:
            w *= q1[t]
        for em, pr in hsd_law(x, [p1] * (g + 1), [q1] * g).items():
            law[em] = law.get(em, F(0)) + w * pr
    return law


def first_two(p1: list[F], q1: list[F], g: int) -> dict[tuple, F]:
    """The law of the first two emitted tokens of a whole generation (context-free: a call
    after one emitted token starts afresh)."""
    call = first_call(p1, q1, g)
    first = {y: sum(pr for em, pr in call.items() if em[0] == y) for y in range(len(p1))}
    out: dict[tuple, F] = {}
    for em, pr in call.items():
        if len(em) >= 2:
            out[em[:2]] = out.get(em[:2], F(0)) + pr
        else:
            for y, w in first.items():
                out[em + (y,)] = out.get(em + (y,), F(0)) + pr * w
    return out


def literal_quantities(x, p1, q1, g):
    """The code's own a_k, plus_k and joint ratio for the drafted path ``x``, run line for line
    (float64 torch): None where torch is missing."""
    try:
        import torch
    except ImportError:
        return None
    p = torch.tensor([[float(v) for v in p1]] * (g + 1), dtype=torch.float64)[None]
    q = torch.tensor([[float(v) for v in q1]] * g, dtype=torch.float64)[None]
    ids = torch.tensor([x])
    q_i = q[0:1, torch.arange(g), ids].squeeze(1)
    q_previous = torch.roll(q_i, 1, 1)
    q_previous[:, 0] = 1
    joint_q_previous = torch.exp(torch.log(q_previous).cumsum(1).unsqueeze(-1))
    q_next = joint_q_previous * q[0:1, 0:g]
    p_i = p[0:1, torch.arange(g), ids].squeeze(1)
    p_previous = torch.roll(p_i, 1, 1)
    p_previous[:, 0] = 1
    joint_p_previous = torch.exp(torch.log(p_previous).cumsum(1)).unsqueeze(-1)
    ratio = torch.maximum(joint_p_previous / joint_q_previous, torch.ones(1, g, 1,
                                                                        dtype=torch.float64))
    previous_max, _ = torch.cummax(ratio, dim=1)
    p_next = joint_p_previous / previous_max * p[0:1, :g]
    diffs = p_next - q_next
    p_plus, p_minus = torch.clamp(diffs, min=0), torch.clamp(-diffs, min=0)
    den = torch.maximum(p_plus.sum(-1, keepdim=True), p_minus.sum(-1, keepdim=True))
    p_primes = p_plus / den
    ratio_all = torch.exp(torch.log(p_i).cumsum(1) - torch.log(q_i).cumsum(1))[0, -1]
    return p_primes.sum(-1)[0].tolist(), p_plus[0].tolist(), float(ratio_all)


def main() -> int:
    p1, q1 = [F(1, 5), F(4, 5)], [F(4, 5), F(1, 5)]
    ok = True
    # the reconstruction is the code's law, path by path
    for x in itertools.product(range(2), repeat=2):
        lit = literal_quantities(x, p1, q1, 2)
        if lit is None:
            print("torch missing: the code cross-check is skipped")
            break
        a_code, plus_code, ratio_code = lit
        Pk, Qk, M, a_mine, plus_mine = F(1), F(1), F(1), [], []
        for k in range(2):
            M = max(M, max(F(1), Pk / Qk))
            row = [Pk / M * p1[y] - Qk * q1[y] for y in range(2)]
            pl = [max(r, F(0)) for r in row]
            den = max(sum(pl), sum(max(-r, F(0)) for r in row))
            a_mine.append(float(sum(pl) / den) if den else float("nan"))
            plus_mine.append([float(v) for v in pl])
            Pk, Qk = Pk * p1[x[k]], Qk * q1[x[k]]
        same = all(abs(u - v) < 1e-12 for u, v in zip(a_code, a_mine, strict=True)) and all(
            abs(u - v) < 1e-12 for r1, r2 in zip(plus_code, plus_mine, strict=True)
            for u, v in zip(r1, r2, strict=True))
        R = float((p1[x[0]] / q1[x[0]]) * (p1[x[1]] / q1[x[1]]))
        same = same and abs(ratio_code - R) < 1e-12
        print(f"path {x}: the code's a_k {a_code}, joint ratio {ratio_code:g}: "
              f"{'the same' if same else 'DIFFERENT'}")
        ok &= same
    # gamma = 1 is speculative sampling: the first call's law is p
    one = first_call(p1, q1, 1)
    first = {y: sum(pr for em, pr in one.items() if em[0] == y) for y in range(2)}
    ok &= first == {0: p1[0], 1: p1[1]}
    print(f"gamma = 1, first token: {first} (target {p1})")
    # gamma = 2: the law of the first two tokens against p x p
    two = first_two(p1, q1, 2)
    target = {(a, b): p1[a] * p1[b] for a in range(2) for b in range(2)}
    tv = sum(abs(two.get(k, F(0)) - target[k]) for k in target) / 2
    for k in sorted(target):
        print(f"  first two = {k}: HSD {two.get(k, F(0))}, target {target[k]}")
    print(f"TV of the first two tokens: {tv} (= {float(tv):.4f})")
    ok &= tv == F(3, 25) and sum(two.values()) == 1
    print("verified" if ok else "NOT verified")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
