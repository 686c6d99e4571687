"""Shared pieces of the batched twins: the result type, input validation, keyed uniforms,
inverse-CDF sampling, and the two chain steps every single-branch twin takes (ratios at the
drafts, the residual at the stop).

Shapes (every twin): ``drafts`` int64 ``[B, k, gamma]``; ``q`` ``[B, k, gamma, V]`` (draft
laws along each branch); ``p`` ``[B, k, gamma + 1, V]`` (target laws along each branch, plus
the bonus law); ``seeds``, ``positions`` int64 ``[B]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from ..keyed import MAX_DRAFTS, STREAM_ACCEPT, STREAM_SAMPLE
from .laws import residual_weights, row_sums
from .rng import call_uniforms, keyed_uniforms, uniforms

__all__ = [
    "Verdict",
    "check_probs",
    "check_inputs",
    "check_token_ids",
    "sample_rows",
    "search_cdf",
    "assemble",
    "coin_uniforms",
    "accept_uniforms",
    "sample_uniforms",
    "call_draws",
    "law_sums",
    "draft_ratios",
    "emit_residual",
    "MAX_DRAFTS",
]


class Verdict(NamedTuple):
    """Outcome of verifying one block of drafts for each of ``B`` requests.

    Attributes
    ----------
    accepted : int64 ``[B]``
        Number ``n`` of drafted tokens accepted, ``0 <= n <= gamma``.
    branch : int64 ``[B]``
        The draft branch whose first ``n`` tokens are emitted (0 when ``k == 1``; when
        several branches share the emitted prefix, the lowest index).
    next_token : int64 ``[B]``
        The token emitted after the accepted prefix: a residual sample when ``n < gamma``,
        the bonus token from the target's last law when ``n == gamma`` (always present,
        so every call emits ``n + 1`` tokens).
    tokens : int64 ``[B, gamma + 1]``
        ``drafts[b, branch[b], :n]`` then ``next_token[b]``, padded with ``-1``.
    """

    accepted: torch.Tensor
    branch: torch.Tensor
    next_token: torch.Tensor
    tokens: torch.Tensor


def _default_atol(dtype: torch.dtype) -> float:
    # float32 softmax over ~1e5 tokens sums to 1 within ~1e-5; half precision far worse
    if dtype == torch.float64:
        return 1e-9
    if dtype == torch.float32:
        return 1e-4
    return 2e-2


def check_probs(x: torch.Tensor, name: str, atol: float | None = None) -> None:
    """Raise ValueError unless x [..., V] is finite, non-negative, each row summing to 1 within
    atol (default by dtype)."""
    if not x.dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating tensor of probabilities, got dtype {x.dtype}")
    if x.numel() == 0:
        return
    # float32 pairwise sums are accurate to ~1e-6 here, far inside the tolerance, and avoid
    # materialising a float64 copy of [B, k, gamma+1, V]
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    sums = x.sum(-1, dtype=acc)
    # NaN and +/-inf anywhere in a row make its sum non-finite, and min / max propagate NaN:
    # the extreme row sums and the smallest entry settle every check, read in one sync
    lo_sum, hi_sum, low = torch.stack([sums.min(), sums.max(), x.amin().to(acc)]).tolist()
    if not (math.isfinite(lo_sum) and math.isfinite(hi_sum)):
        raise ValueError(f"{name} contains NaN or inf; probabilities must be finite")
    if low < 0:
        raise ValueError(
            f"{name} has negative entries; probabilities must be >= 0 "
            "(did you pass logits? apply a softmax first)"
        )
    tol = _default_atol(x.dtype) if atol is None else atol
    dev = max(abs(lo_sum - 1.0), abs(hi_sum - 1.0))
    if dev > tol:
        raise ValueError(
            f"{name} rows must sum to 1 over the vocabulary (last axis); the worst row is off "
            f"by {dev:.3g} > atol={tol:g}; normalise (softmax) first or pass a larger atol"
        )


def _as_int_vector(x: torch.Tensor | int, name: str, B: int, device: torch.device) -> torch.Tensor:
    if x is None or isinstance(x, (str, bytes, float, bool)):
        raise TypeError(f"{name} must be an int or an int64 tensor [B] (one per request), got "
                        f"{type(x).__name__}")
    t = torch.as_tensor(x, device=device)
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name} must hold integers (int64), got dtype {t.dtype}")
    t = t.to(torch.int64)
    if t.ndim == 0:
        t = t.expand(B)
    if t.shape != (B,):
        raise ValueError(
            f"{name} must have shape [B] = [{B}] (one per request), got {tuple(t.shape)}"
        )
    return t


def check_token_ids(drafts: torch.Tensor) -> None:
    """Raise ValueError unless ``drafts`` holds integers (token ids), not floats or bools."""
    if drafts.dtype.is_floating_point or drafts.dtype == torch.bool or drafts.dtype.is_complex:
        raise ValueError(f"drafts must hold integer token ids (int64), got dtype {drafts.dtype}")


def check_inputs(
    drafts: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    seeds: torch.Tensor | int,
    positions: torch.Tensor | int,
    *,
    validate: bool = True,
    atol: float | None = None,
    max_k: int | None = None,
    rule: str = "",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Normalise shapes to ``drafts [B,k,g]``, ``p [B,k,g+1,V]``, ``q [B,k,g,V]`` and validate.

    ``k == 1`` callers may drop the k axis (``drafts [B,g]``, ``p [B,g+1,V]``, ``q [B,g,V]``).
    ``validate=False`` skips the value checks (finite, non-negative, normalised, drafted
    tokens of positive draft probability), which each cost a pass over ``p`` and ``q``
    and a device sync; the shape checks always run.
    """
    if not all(isinstance(t, torch.Tensor) for t in (drafts, p, q)):
        raise ValueError("drafts, p and q must be torch tensors")
    if drafts.ndim == 2 and p.ndim == 3 and q.ndim == 3:
        drafts, p, q = drafts.unsqueeze(1), p.unsqueeze(1), q.unsqueeze(1)
    if drafts.ndim != 3:
        raise ValueError(
            f"drafts must have shape [B, k, gamma] (or [B, gamma] with p [B, gamma+1, V] and "
            f"q [B, gamma, V] for one branch), got {tuple(drafts.shape)}"
        )
    check_token_ids(drafts)
    B, k, g = drafts.shape
    if p.ndim != 4 or q.ndim != 4:
        raise ValueError(
            f"p must be [B, k, gamma+1, V] and q [B, k, gamma, V]; "
            f"got p {tuple(p.shape)}, q {tuple(q.shape)}"
        )
    V = p.shape[-1]
    if tuple(p.shape) != (B, k, g + 1, V):
        raise ValueError(
            f"p must have shape [B, k, gamma+1, V] = [{B}, {k}, {g + 1}, V] (target laws at each "
            f"draft position plus the bonus position), got {tuple(p.shape)}"
        )
    if tuple(q.shape) != (B, k, g, V):
        raise ValueError(
            f"q must have shape [B, k, gamma, V] = [{B}, {k}, {g}, {V}] (draft laws at each draft "
            f"position), got {tuple(q.shape)}"
        )
    if V < 1:
        raise ValueError("the vocabulary axis (last axis of p and q) is empty")
    if k > MAX_DRAFTS:
        raise ValueError(f"k={k} draft branches exceeds MAX_DRAFTS={MAX_DRAFTS}")
    if max_k is not None and k > max_k:
        raise ValueError(
            f"rule {rule!r} verifies a single draft branch (k=1), got k={k}; "
            "use a multi-draft rule (kseq, rrs, optimal, gumbel) for k > 1"
        )
    if p.device != drafts.device or q.device != drafts.device:
        raise ValueError(
            f"drafts, p and q must be on one device, got {drafts.device}, {p.device}, {q.device}"
        )
    seeds_t = _as_int_vector(seeds, "seeds", B, drafts.device)
    pos_t = _as_int_vector(positions, "positions", B, drafts.device)
    drafts = drafts.to(torch.int64)
    if validate:
        check_probs(p, "p", atol)
        check_probs(q, "q", atol)
        if drafts.numel():
            if bool(((drafts < 0) | (drafts >= V)).any()):
                raise ValueError(f"drafts has token ids outside [0, V) = [0, {V})")
            if bool((q.gather(-1, drafts.unsqueeze(-1)) <= 0).any()):
                raise ValueError(
                    "drafts contains token(s) with draft probability q = 0: they cannot have been "
                    "drafted from q; pass the law the drafts were sampled from"
                )
        if bool((pos_t < 0).any()):
            raise ValueError("positions must be >= 0 (absolute index of the first drafted token)")
    return drafts, p, q, seeds_t, pos_t


def coin_uniforms(seeds: torch.Tensor, positions: torch.Tensor, g: int, k: int) -> torch.Tensor:
    """``[B, g, k]`` float64: ``U(seed, t, STREAM_ACCEPT, i * MAX_DRAFTS + j)``, the acceptance
    coin of branch ``j`` at drafted offset ``i``.

    The layout does not depend on ``k``, so a multi-draft rule with ``k = 1`` uses exactly
    the coins of ``token`` (and is coin-for-coin identical to it where the rules coincide).
    """
    seeds = torch.as_tensor(seeds, dtype=torch.int64)
    positions = torch.as_tensor(positions, dtype=torch.int64, device=seeds.device)
    positions = positions.expand(seeds.shape)
    i = torch.arange(g, device=seeds.device, dtype=torch.int64).view(1, g, 1)
    j = torch.arange(k, device=seeds.device, dtype=torch.int64).view(1, 1, k)
    return keyed_uniforms(
        seeds.view(-1, 1, 1), positions.view(-1, 1, 1), STREAM_ACCEPT, i * MAX_DRAFTS + j
    )


def accept_uniforms(seeds: torch.Tensor, positions: torch.Tensor, g: int) -> torch.Tensor:
    """``[B, g]`` float64: branch 0's coins, ``U(seed, t, STREAM_ACCEPT, i * MAX_DRAFTS)``."""
    return coin_uniforms(seeds, positions, g, 1)[:, :, 0]


def sample_uniforms(seeds: torch.Tensor, positions: torch.Tensor, g: int) -> torch.Tensor:
    """``[B, g+1]`` float64: ``U(seed, t, STREAM_SAMPLE, n)``, the draw of the token emitted
    at offset ``n``."""
    return uniforms(seeds, positions, g + 1, stream=STREAM_SAMPLE)


def call_draws(seeds: torch.Tensor, positions: torch.Tensor, g: int, k: int,
               accept_u: torch.Tensor | None = None,
               sample_u: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A call's coins ``[B, g, k]`` and draws ``[B, g + 1]``, float64: ``accept_u`` (any shape
    of ``B g k`` entries) and ``sample_u`` where given, else the keyed ones
    (:func:`.rng.call_uniforms`, both streams in one pass)."""
    B = seeds.shape[0]
    if accept_u is None and sample_u is None:
        return call_uniforms(seeds, positions, g, k)
    coins = coin_uniforms(seeds, positions, g, k) if accept_u is None \
        else accept_u.to(torch.float64).reshape(B, g, k)
    u = sample_uniforms(seeds, positions, g) if sample_u is None else sample_u.to(torch.float64)
    return coins, u


def sample_rows(
    weights: torch.Tensor, u: torch.Tensor, fallback: torch.Tensor | None = None
) -> torch.Tensor:
    """Inverse-CDF sample of one token per row of non-negative ``weights`` ``[N, V]``.

    Row ``n`` returns the first index ``i`` with ``cdf[i] > u[n] * cdf[-1]`` (float64
    cumulative sums), so a token of weight 0 is never returned. Rows whose total weight
    is 0 sample from ``fallback`` instead (their conditioning event has probability 0 in
    exact arithmetic; it can only be reached through float rounding).
    """
    return search_cdf(weights.to(torch.float64).cumsum(-1), u, fallback)


def search_cdf(cdf: torch.Tensor, u: torch.Tensor,
               fallback: torch.Tensor | Callable[[], torch.Tensor] | None = None
               ) -> torch.Tensor:
    """:func:`sample_rows` on the float64 running sums ``cdf [N, V]`` of the weights (a caller
    that made the weights may sum them in place: ``weights.cumsum_(-1)``); ``fallback`` may
    be a function that makes it, called only if a row has no weight."""
    total = cdf[:, -1]
    if fallback is not None:
        empty = total <= 0
        if bool(empty.any()):
            law = fallback() if callable(fallback) else fallback
            cdf = torch.where(empty.unsqueeze(-1), law.to(torch.float64).cumsum(-1), cdf)
            total = cdf[:, -1]
    # keep the target strictly below the total so the search always lands on a positive cell
    target = torch.minimum(
        u.to(torch.float64) * total, torch.nextafter(total, torch.zeros_like(total))
    )
    idx = torch.searchsorted(cdf, target.unsqueeze(-1), right=True).squeeze(-1)
    return idx.clamp_(max=cdf.shape[-1] - 1)


def assemble(
    drafts: torch.Tensor, accepted: torch.Tensor, branch: torch.Tensor, next_token: torch.Tensor
) -> Verdict:
    """Build the :class:`Verdict` (``drafts`` is ``[B, k, g]``)."""
    B, _, g = drafts.shape
    rows = torch.arange(B, device=drafts.device)
    chosen = drafts[rows, branch]  # [B, g]
    tokens = torch.full((B, g + 1), -1, dtype=torch.int64, device=drafts.device)
    col = torch.arange(g + 1, device=drafts.device).unsqueeze(0)  # [1, g+1]
    tokens[:, :g] = torch.where(col[:, :g] < accepted.unsqueeze(1), chosen, tokens[:, :g])
    tokens.scatter_(1, accepted.unsqueeze(1), next_token.unsqueeze(1))
    return Verdict(accepted, branch, next_token, tokens)


def law_sums(drafts: torch.Tensor, p: torch.Tensor,
             q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 row sums ``(sum p [B, k, g], sum q [B, k, g])`` at the drafted offsets: what
    normalises the laws (:mod:`.laws`)."""
    g = drafts.shape[-1]
    return row_sums(p[:, :, :g]), row_sums(q)


def draft_ratios(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor, *,
                 sums: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """``r[b, j, i] = P(x) / Q(x)`` at the drafted ``x``, float64 ``[B, k, g]``, on the
    normalised laws ``P = p / sum p``, ``Q = q / sum q`` (:mod:`.laws`); ``sums``: their row
    sums :func:`law_sums`, if the caller has them."""
    x = drafts.unsqueeze(-1)  # [B, k, g, 1]
    g = drafts.shape[-1]
    sp, sq = law_sums(drafts, p, q) if sums is None else sums
    px = p[:, :, :g].gather(-1, x).squeeze(-1).to(torch.float64) / sp
    qx = q.gather(-1, x).squeeze(-1).to(torch.float64) / sq
    return px / qx


def emit_residual(p: torch.Tensor, q: torch.Tensor, n: torch.Tensor, w_n: torch.Tensor,
                  u: torch.Tensor, *,
                  sums: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Token emitted at stop position ``n``: ``norm(max(w_n P_n - Q_n, 0))`` with ``Q_g := 0``,
    on the normalised laws ``P = p / sum p``, ``Q = q / sum q``.

    ``p [B, g+1, V]``, ``q [B, g, V]``, ``n [B]`` in ``0..g``, ``w_n [B]`` (1 for the token rule
    and for the bonus), ``u [B]``; ``sums``: the float64 row sums ``(sum p_n, sum q_n) [B]``
    at the stop rows if the caller has them (read where ``n < g``). At ``n = g`` the weight
    row is ``w_g p_g``; callers pass ``w_n = 1`` there so the bonus is an exact sample of
    ``p_g``. A residual of no mass (an event of probability 0, reached only through
    rounding) samples ``P_n``.
    """
    B, g1, V = p.shape
    g = g1 - 1
    rows = torch.arange(B, device=p.device)
    at = (rows, n)
    if g == 0:  # no draft: the bonus token
        return sample_rows(p[:, 0], u)
    at_q = (rows, n.clamp(max=g - 1))
    sp, sq = (row_sums(p, at), row_sums(q, at_q)) if sums is None else sums
    stop = n < g
    a = w_n.to(torch.float64) / torch.where(stop, sp, 1.0)
    b = torch.where(stop, 1.0 / sq, 0.0)
    cdf = residual_weights(p, q, at, at_q, a, b).cumsum_(-1)
    return search_cdf(cdf, u, fallback=lambda: p[at])
