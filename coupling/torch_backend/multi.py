r"""Multi-draft verification along a block: ``kseq``, ``rrs``, ``optimal``, ``gumbel``.

Draft tree
----------
Request ``b`` has ``k`` draft branches of ``g`` tokens each, ``drafts[b, j, :]``, with the
draft and target laws along each branch (``q[b, j, i]``, ``p[b, j, i]``). With replacement
(SpecTr / SpecInfer trees) the branches are i.i.d. continuations of the context; branches
that share a prefix have i.i.d. continuations after it. Without replacement (``rrs``
/``optimal`` with ``replacement=False``) the ``k`` first tokens are distinct (successive
sampling from ``q_0``) and each branch then continues as a single chain.

Verification walks the tree position by position (vectorised over the batch):

* the *surviving* branches at offset ``i`` are those whose first ``i`` tokens equal the
  emitted prefix (all ``k`` at ``i = 0``);
* their tokens at offset ``i`` are i.i.d. draws from ``q_i`` along that prefix (the laws
  ``p_i``, ``q_i`` are read from the lowest-index survivor; all survivors share them), so
  the single-step multi-draft rule applies to them and emits ``y_i`` with law exactly
  ``p_i`` (lossless by the rule's own guarantee);
* if ``y_i`` equals the token of a survivor, the survivors shrink to the branches whose
  token is ``y_i`` and the walk continues (this holds whichever way the rule produced
  ``y_i``: the unobserved continuations of those branches are still i.i.d. ``q_{i+1}``);
  otherwise ``y_i`` is the residual token and the walk stops;
* a survivor at the end of the block gets the bonus token from its ``p_g``.

Survivors are i.i.d. given the prefix because every decision so far depended only on
tokens at earlier offsets and on independent coins. Without replacement the survivors
after offset 0 are a single branch, and each single-step rule with one draft reduces to
``token`` (and ``optimal``'s k = 1 rule *is* ``token``).

Single-step rules (numpy references in :mod:`coupling.rules`, same conventions: strict
``u * (.) < (.)`` tests, inverse-CDF residual draws, float64 arithmetic)

``rrs`` (recursive rejection sampling): target ``r_0 = p``; for each surviving draft in
branch order, accept iff ``u_j q_j(x_j) < r(x_j)``, else ``r <- norm((r - q_j)_+)``; with
``replacement=False`` also ``q_{j+1} = q_j`` with ``x_j`` removed, renormalised. After all
are rejected, draw from ``r``.

``kseq`` (SpecTr k-sequential selection, i.i.d. drafts only): with ``m`` survivors and
``rho = rho*(p, q, m)`` the smallest root in ``[1, m]`` of
:math:`g(\rho) = \sum_y \min(\rho q, p) - (1 - (1 - \beta(\rho))^m)`,
:math:`\beta(\rho) = \sum_y \min(q, p/\rho)`, accept the first survivor with
``u_j rho q(x_j) < p(x_j)``; else draw from
:math:`(p - c \min(q, p/\rho))_+` with :math:`c = (1 - (1-\beta)^m)/\beta`, summed as the
geometric series :math:`\sum_{i<m} (1-\beta)^i` (no cancellation for tiny :math:`\beta`).
``rho*`` is the same root as :func:`coupling.rules.kseq.optimal_rho` (which sorts the
breakpoints ``p/q`` and polishes with Brent's method); here the Illinois variant of
regula falsi on ``[1, m]``, one O(V) pass per iteration and no sort, returning a point
where the validity margin :math:`\rho - c(\beta(\rho)) \ge 0` (:func:`kseq_rho`).

``optimal`` (LP-optimal acceptance): with one survivor it is ``token`` (optimal for k = 1,
vectorised). With ``m >= 2`` survivors it samples the row of the draft tuple in an exact
LP plan (:func:`coupling.rules.optimal.plan`, solved with POT on the enumerated tuple
law): this is a per-request numpy LP, a Python loop over the affected rows, and it is
limited to small vocabularies (``T * V <= MAX_PLAN_ENTRIES``). **There is no exact
large-V sampler for k >= 2**; it raises ``ValueError`` rather than approximate.

``gumbel`` (shared-noise Gumbel-max coupling, Daliri, Musco & Suresh 2024): the token at
absolute position ``t + i`` is the target's Gumbel-max sample
``y_i = argmax_v log p_i(v) + G(seed, t + i, v)`` (float64), the same noise the drafter
uses in :func:`gumbel_draft`. Drafts are accepted while a survivor's token equals
``y_i``; the first mismatch emits ``y_i``. The output never depends on ``q`` nor on the
drafts (drafter invariance), only on ``p`` along the emitted prefix and the noise; it is
lossless because each ``y_i`` is an exact sample of ``p_i`` and ``G(seed, t + i)`` is
independent of everything that decided the prefix. Any ``k`` is supported.

Randomness: coin of branch ``j`` at offset ``i``: ``U(seed, t, STREAM_ACCEPT, i*MAX_DRAFTS + j)``;
residual / bonus / LP-row draw at offset ``i``: ``U(seed, t, STREAM_SAMPLE, i)``; Gumbel noise
``G(seed, t + i, v)`` (stream ``STREAM_GUMBEL``), keyed by the token's absolute position.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..rules.kseq import RESIDUAL_ULPS as _KSEQ_RESIDUAL_ULPS
from ._common import Verdict, assemble, check_inputs, coin_uniforms, sample_rows, sample_uniforms
from .rng import gumbel_noise

__all__ = ["kseq", "rrs", "optimal", "gumbel", "gumbel_draft", "kseq_rho", "walk_tree"]

# A single-step rule on the A unfinished rows: (p_i [A,V], q_i [A,V], x [A,k], alive [A,k],
# coins [A,k], u [A], offset i, batch rows act [A]) -> output token y [A]
StepFn = Callable[
    [
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        int,
        torch.Tensor,
    ],
    torch.Tensor,
]


def _first_true(mask: torch.Tensor) -> torch.Tensor:
    """Index of the first True along the last axis (0 if none). ``[B, k] -> [B]``."""
    return mask.to(torch.uint8).argmax(-1)


def walk_tree(
    step: StepFn,
    drafts: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    coins: torch.Tensor,
    u_sample: torch.Tensor,
    bonus: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> Verdict:
    """Walk the draft tree (module doc) with a single-step rule ``step``.

    ``drafts [B,k,g]``, ``p [B,k,g+1,V]``, ``q [B,k,g,V]``, ``coins [B,g,k]``, ``u_sample [B,g+1]``.
    ``bonus(p_g [A,V], u [A], act [A]) -> [A]`` draws the bonus token of the unfinished
    rows ``act`` (default: inverse CDF with ``u``).
    """
    B, k, g = drafts.shape
    dev = drafts.device
    alive = torch.ones(B, k, dtype=torch.bool, device=dev)  # branch agrees with the emitted prefix
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    accepted = torch.zeros(B, dtype=torch.int64, device=dev)
    nxt = torch.zeros(B, dtype=torch.int64, device=dev)
    branch = torch.zeros(B, dtype=torch.int64, device=dev)
    for i in range(g):  # sequential: survivors at i depend on the token emitted at i-1
        # only unfinished rows are verified at offset i (gathered, then scattered back);
        # the sync this costs is what lets a B = 1 call stop at its first residual token
        act = torch.nonzero(~done).squeeze(1)
        if act.numel() == 0:
            break
        al = alive[act]  # [A, k]
        ref = _first_true(al)  # [A] lowest surviving branch: its laws are the prefix's laws
        x = drafts[act, :, i]  # [A, k]
        y = step(p[act, ref, i], q[act, ref, i], x, al, coins[act, i], u_sample[act, i], i, act)
        hit = al & (x == y.unsqueeze(1))  # [A, k] survivors that drafted y
        go = hit.any(-1)
        stop = act[~go]
        nxt[stop] = y[~go]
        branch[stop] = ref[~go]
        accepted[act] += go.to(torch.int64)
        alive[act] = torch.where(go.unsqueeze(1), hit, al)
        done[stop] = True
    act = torch.nonzero(~done).squeeze(1)
    if act.numel():
        ref = _first_true(alive[act])
        p_end = p[act, ref, g]  # [A, V]
        u_end = u_sample[act, g]
        nxt[act] = bonus(p_end, u_end, act) if bonus is not None else sample_rows(p_end, u_end)
        branch[act] = ref
    return assemble(drafts, accepted, branch, nxt)


# --------------------------------------------------------------------------------- rrs
def _rrs_step(replacement: bool) -> StepFn:
    def step(p_i, q_i, x, alive, coins, u, i, act):
        B, k = x.shape
        r = p_i.to(torch.float64)  # [B, V] current target
        qc = q_i.to(torch.float64)  # [B, V] current draft law
        decided = torch.zeros(B, dtype=torch.bool, device=x.device)
        y = torch.zeros(B, dtype=torch.int64, device=x.device)
        for j in range(k):  # sequential by definition: each rejection changes the target
            xj = x[:, j : j + 1]  # [B, 1]
            test = alive[:, j] & ~decided
            acc = test & (coins[:, j] * qc.gather(1, xj).squeeze(1) < r.gather(1, xj).squeeze(1))
            y = torch.where(acc, xj.squeeze(1), y)
            decided = decided | acc
            rej = (test & ~acc).unsqueeze(1)
            if not bool(rej.any()):  # nothing rejected: r and q_j stay as they are
                continue
            d = (r - qc).clamp_(min=0.0)
            z = d.sum(-1, keepdim=True)
            # z == 0: this step accepts with probability 1, the residual is never used
            r = torch.where(rej & (z > 0), d / torch.where(z > 0, z, 1.0), r)
            if not replacement:
                qn = qc.scatter(1, xj, 0.0)
                zq = qn.sum(-1, keepdim=True)
                qc = torch.where(rej & (zq > 0), qn / torch.where(zq > 0, zq, 1.0), qc)
        if bool(decided.all()):
            return y
        return torch.where(decided, y, sample_rows(r, u))

    return step


# -------------------------------------------------------------------------------- kseq
def _geometric_c(beta: torch.Tensor, mf: torch.Tensor, kmax: int) -> torch.Tensor:
    r""":math:`c = (1 - (1-\beta)^m)/\beta = \sum_{i<m} (1-\beta)^i`, summed term by term (no
    cancellation for tiny :math:`\beta`; same form as :func:`coupling.rules.kseq._c`)."""
    x = 1.0 - beta
    term = torch.ones_like(x)
    c = torch.zeros_like(x)
    for i in range(kmax):
        c = c + torch.where(mf > i, term, 0.0)
        term = term * x
    return c


def kseq_rho(p: torch.Tensor, q: torch.Tensor, m: torch.Tensor, iters: int = 200) -> torch.Tensor:
    r"""Smallest :math:`\rho \in [1, m]` whose K-SEQ residual is a distribution, per row.

    ``p, q`` float64 ``[B, V]``, ``m`` int ``[B]`` (number of drafts). Returns float64 ``[B]``.
    As in :func:`coupling.rules.kseq.optimal_rho`: ``rho = 1`` when ``m <= 1``, when
    :math:`\beta(1) = 0`, or when the validity margin
    :math:`h(\rho) = \rho - c(\beta(\rho))` (:math:`\beta(\rho) = \sum_y \min(q, p/\rho)`,
    ``c`` by :func:`_geometric_c`) is already ``>= 0`` at 1; otherwise the smallest root of
    the non-decreasing, continuous, piecewise-smooth ``h`` in ``[1, m]``.

    The numpy reference sorts the breakpoints ``p/q`` and polishes with Brent's method; here,
    without a sort, the Illinois variant of regula falsi runs on the bracket
    ``h(lo) < 0 <= h(hi)`` (bisection if a step leaves it), one pass over the vocabulary per
    evaluation, until the bracket is narrower than 1e-15 (relative); ``hi`` is returned, so
    ``h(rho) >= 0`` in floating point, as in the reference.
    """
    B, V = p.shape
    rho = torch.ones(B, dtype=torch.float64, device=p.device)
    mf_all = m.to(torch.float64)
    need = mf_all > 1
    if not bool(need.any()):
        return rho
    kmax = int(m.max())
    b1 = torch.minimum(p, q).sum(-1)  # beta(1)
    h1 = 1.0 - _geometric_c(b1, mf_all, kmax)
    need = need & (b1 > 0) & (h1 < 0)
    if not bool(need.any()):
        return rho
    idx = torch.nonzero(need).squeeze(1)
    P, Q, mf = p[idx], q[idx], mf_all[idx]  # only the rows that need a root

    def h_of(x: torch.Tensor) -> torch.Tensor:
        beta = torch.minimum(Q, P / x.unsqueeze(1)).sum(-1)  # one pass over the vocabulary
        return x - _geometric_c(beta, mf, kmax)

    # Illinois (modified regula falsi): superlinear on a piecewise-smooth h, and, unlike
    # Newton, not stalled by the kinks at the breakpoints
    lo, hi = torch.ones_like(mf), mf.clone()
    hlo, hhi = h1[idx], h_of(hi).clamp(min=0.0)  # c <= m always: rho = m is valid
    side = torch.zeros_like(mf)
    for it in range(iters):
        x = hi - hhi * (hi - lo) / torch.where(hhi > hlo, hhi - hlo, 1.0)
        x = torch.where((x > lo) & (x < hi), x, 0.5 * (lo + hi))
        hx = h_of(x)
        good = hx >= 0
        # the end that stayed put twice in a row has its value halved (Illinois step)
        hlo = torch.where(good & (side > 0), 0.5 * hlo, hlo)
        hhi = torch.where(~good & (side < 0), 0.5 * hhi, hhi)
        hi, hhi = torch.where(good, x, hi), torch.where(good, hx, hhi)
        lo, hlo = torch.where(good, lo, x), torch.where(good, hlo, hx)
        side = torch.where(good, 1.0, -1.0)
        if it % 4 == 3 and float(((hi - lo) / hi).amax()) <= 1e-15:  # one sync every 4 steps
            break
    return rho.index_put((idx,), hi)


def _kseq_step(p_i, q_i, x, alive, coins, u, i, act):
    B, k = x.shape
    p64, q64 = p_i.to(torch.float64), q_i.to(torch.float64)
    m = alive.sum(-1)
    rho = kseq_rho(p64, q64, m)  # [B]
    decided = torch.zeros(B, dtype=torch.bool, device=x.device)
    y = torch.zeros(B, dtype=torch.int64, device=x.device)
    for j in range(k):
        xj = x[:, j : j + 1]
        acc = (
            alive[:, j]
            & ~decided
            & (coins[:, j] * rho * q64.gather(1, xj).squeeze(1) < p64.gather(1, xj).squeeze(1))
        )
        y = torch.where(acc, xj.squeeze(1), y)
        decided = decided | acc
    if bool(decided.all()):
        return y
    low = torch.minimum(q64, p64 / rho.unsqueeze(1))  # [B, V] min(q, p / rho)
    beta = low.sum(-1, keepdim=True)
    c = _geometric_c(beta, m.clamp(min=1).to(torch.float64).unsqueeze(1), max(int(m.max()), 1))
    # exact zeros of the residual come out as +-1e-17: within 64 ulps of p(x) they count as 0,
    # as in coupling.rules.kseq._residual (the two backends then agree on the support)
    r = p64 - c * low
    r = torch.where(r > _KSEQ_RESIDUAL_ULPS * torch.finfo(torch.float64).eps * p64, r, 0.0)
    res = torch.where(beta > 0, r, p64)
    return torch.where(decided, y, sample_rows(res, u, fallback=p64))


# ----------------------------------------------------------------------------- optimal
def _optimal_step(replacement: bool) -> StepFn:
    token_step = _rrs_step(True)  # with one draft, rrs is exactly the token rule

    def step(p_i, q_i, x, alive, coins, u, i, act):
        from ..rules import optimal as ref

        y = token_step(p_i, q_i, x, alive & (torch.cumsum(alive, -1) == 1), coins, u, i, act)
        multi = alive.sum(-1) >= 2
        if not bool(multi.any()):
            return y
        # m >= 2 survivors: sample the draft tuple's row of an exact LP plan (numpy, per row)
        y = y.clone()
        idx = torch.nonzero(multi).squeeze(1).tolist()
        P = p_i[idx].to(torch.float64).cpu().numpy()
        Q = q_i[idx].to(torch.float64).cpu().numpy()
        X, A, U = x[idx].cpu().numpy(), alive[idx].cpu().numpy(), u[idx].cpu().numpy()
        for n, b in enumerate(idx):
            pb, qb = P[n] / P[n].sum(), Q[n] / Q[n].sum()
            out = ref.verify(pb, qb, X[n][A[n]], float(U[n]), replacement=replacement)
            y[b] = out
        return y

    return step


# ------------------------------------------------------------------------------ gumbel
def gumbel_draft(
    q: torch.Tensor, seeds: torch.Tensor | int, positions: torch.Tensor | int
) -> torch.Tensor:
    """Drafter side of the Gumbel coupling: ``argmax_v log q[..., v] + G(seed, position, v)``.

    ``q`` is ``[..., V]``; ``seeds`` and ``positions`` broadcast to ``q.shape[:-1]`` (e.g. a
    ``[B]`` batch drafting the token at absolute position ``positions[b]``). float64.
    """
    if not isinstance(q, torch.Tensor) or not q.dtype.is_floating_point or q.ndim < 1:
        raise ValueError("q must be a floating tensor [..., V] of draft probabilities")
    s = torch.as_tensor(seeds, device=q.device)
    t = torch.as_tensor(positions, device=q.device)
    s, t = torch.broadcast_tensors(s, t)
    s, t = s.expand(q.shape[:-1]), t.expand(q.shape[:-1])
    G = gumbel_noise(s, t, q.shape[-1], dtype=torch.float64, device=q.device)
    return torch.argmax(q.to(torch.float64).log() + G, -1)


def _gumbel_target(
    p_rows: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """``argmax_v log p[b, v] + G(seeds[b], positions[b], v)`` (float64), ``[B, V] -> [B]``."""
    G = gumbel_noise(seeds, positions, p_rows.shape[-1], dtype=torch.float64, device=p_rows.device)
    return torch.argmax(p_rows.to(torch.float64).log() + G, -1)


# ------------------------------------------------------------------------------ public
def _multi(
    rule: str,
    drafts: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    seeds,
    positions,
    *,
    replacement: bool,
    validate: bool,
    atol: float | None,
    accept_u: torch.Tensor | None,
    sample_u: torch.Tensor | None,
) -> Verdict:
    drafts, p, q, seeds, positions = check_inputs(
        drafts, p, q, seeds, positions, validate=validate, atol=atol, rule=rule
    )
    B, k, g = drafts.shape
    if not replacement and validate and k > 1 and g > 0:
        first = drafts[:, :, 0].sort(-1).values
        if bool((first[:, 1:] == first[:, :-1]).any()):
            raise ValueError(
                "replacement=False promises k distinct first tokens (successive sampling), "
                "but some "
                "request repeats one; pass replacement=True for i.i.d. branches"
            )
    coins = (
        coin_uniforms(seeds, positions, g, k) if accept_u is None else accept_u.to(torch.float64)
    )
    u = sample_uniforms(seeds, positions, g) if sample_u is None else sample_u.to(torch.float64)
    if coins.shape != (B, g, k) or u.shape != (B, g + 1):
        raise ValueError(f"accept_u must be [B, gamma, k] = {(B, g, k)} and sample_u [B, gamma+1]")
    if rule == "rrs":
        step = _rrs_step(replacement)
    elif rule == "kseq":
        step = _kseq_step
    else:
        step = _optimal_step(replacement)
    return walk_tree(step, drafts, p, q, coins, u)


def rrs(
    drafts,
    p,
    q,
    *,
    seeds,
    positions,
    replacement: bool = True,
    validate: bool = True,
    atol: float | None = None,
    accept_u=None,
    sample_u=None,
) -> Verdict:
    """Recursive rejection sampling over a draft tree (module doc), batched.

    ``drafts [B,k,g]``, ``p [B,k,g+1,V]``, ``q [B,k,g,V]``, ``seeds``/``positions`` ``[B]``;
    ``replacement=False``: the k first tokens are distinct (successive sampling) and each
    branch continues as a single chain. ``accept_u [B,g,k]`` / ``sample_u [B,g+1]`` override
    the keyed uniforms (tests). Returns a :class:`Verdict`.
    """
    return _multi(
        "rrs",
        drafts,
        p,
        q,
        seeds,
        positions,
        replacement=replacement,
        validate=validate,
        atol=atol,
        accept_u=accept_u,
        sample_u=sample_u,
    )


def kseq(
    drafts,
    p,
    q,
    *,
    seeds,
    positions,
    replacement: bool = True,
    validate: bool = True,
    atol: float | None = None,
    accept_u=None,
    sample_u=None,
) -> Verdict:
    """SpecTr k-sequential selection over a draft tree of i.i.d. branches (module doc), batched."""
    if not replacement:
        raise ValueError(
            "kseq is defined for i.i.d. drafts only; use replacement=True (or rrs/optimal)"
        )
    return _multi(
        "kseq",
        drafts,
        p,
        q,
        seeds,
        positions,
        replacement=True,
        validate=validate,
        atol=atol,
        accept_u=accept_u,
        sample_u=sample_u,
    )


def optimal(
    drafts,
    p,
    q,
    *,
    seeds,
    positions,
    replacement: bool = True,
    validate: bool = True,
    atol: float | None = None,
    accept_u=None,
    sample_u=None,
) -> Verdict:
    """LP-optimal verification over a draft tree (module doc).

    One survivor: the token rule (vectorised). ``m >= 2`` survivors: exact LP-plan sampling,
    numpy, per row, small vocabularies only (``ValueError`` beyond
    :data:`coupling.rules.optimal.MAX_PLAN_ENTRIES`).
    """
    return _multi(
        "optimal",
        drafts,
        p,
        q,
        seeds,
        positions,
        replacement=replacement,
        validate=validate,
        atol=atol,
        accept_u=accept_u,
        sample_u=sample_u,
    )


def gumbel(
    drafts,
    p,
    q=None,
    *,
    seeds,
    positions,
    noise: torch.Tensor | None = None,
    replacement: bool = True,
    validate: bool = True,
    atol: float | None = None,
) -> Verdict:
    """Gumbel-max coupling along a draft tree (module doc), batched.

    Emits the target's keyed Gumbel-max stream ``argmax(log p_i + G(seed, t + i))`` and
    accepts drafts while they agree with it. ``q`` is only validated (and may be None) and
    ``replacement`` is accepted for a uniform call signature: the output depends on neither.
    ``noise``: optional float64 ``[B, gamma+1, V]`` holding ``gumbel_noise(seeds, t + i, V)``
    for ``i = 0..gamma``, e.g. kept from drafting with :func:`gumbel_draft`, to skip
    recomputing it (about 0.8 ms per 49152-entry vector on one CPU thread); the caller
    vouches that it is that noise.
    """
    if q is None:  # the rule never reads q: validate against a uniform stand-in
        if not isinstance(p, torch.Tensor) or p.ndim not in (3, 4) or not p.dtype.is_floating_point:
            raise ValueError("p must be a floating tensor [B, k, gamma+1, V] (or [B, gamma+1, V])")
        q = torch.full(
            (*p.shape[:-2], p.shape[-2] - 1, p.shape[-1]),
            1.0 / p.shape[-1],
            dtype=p.dtype,
            device=p.device,
        )
    drafts, p, q, seeds, positions = check_inputs(
        drafts, p, q, seeds, positions, validate=validate, atol=atol, rule="gumbel"
    )
    B, k, g = drafts.shape
    V = p.shape[-1]
    if noise is not None and (
        not isinstance(noise, torch.Tensor) or tuple(noise.shape) != (B, g + 1, V)
    ):
        raise ValueError(
            f"noise must be a tensor [B, gamma+1, V] = {(B, g + 1, V)} of keyed Gumbel noise "
            "(gumbel_noise(seeds, positions + i, V) for i = 0..gamma), or None"
        )
    dummy_coins = torch.zeros(B, g, k, dtype=torch.float64, device=drafts.device)
    dummy_u = torch.zeros(B, g + 1, dtype=torch.float64, device=drafts.device)

    def target_token(p_rows: torch.Tensor, act: torch.Tensor, i: int) -> torch.Tensor:
        if noise is None:
            return _gumbel_target(p_rows, seeds[act], positions[act] + i)
        G = noise[act, i].to(torch.float64)
        return torch.argmax(p_rows.to(torch.float64).log() + G, -1)

    def step(p_i, q_i, x, alive, coins, u, i, act):
        return target_token(p_i, act, i)

    def bonus(p_g, u, act):
        return target_token(p_g, act, g)

    return walk_tree(step, drafts, p, q, dummy_coins, dummy_u, bonus=bonus)
