"""``gumbel``'s batched torch twin: the drafter-invariant Gumbel-max coupling along draft trees.

The token at absolute position ``t + i`` is the target's Gumbel-max sample
``y_i = argmax_v log p_i(v) + G(seed, t + i, v)`` (float64), with the keyed noise the drafter
uses in :func:`draft`. Drafts are accepted while a survivor's token equals ``y_i``; the first
mismatch emits ``y_i``. The output never depends on ``q`` nor on the drafts, only on ``p``
along the emitted prefix and the noise: under a fixed seed the stream is the target's own
Gumbel-max stream, whatever the drafter (drafter invariance). It is lossless because each
``y_i`` is an exact sample of ``p_i`` and ``G(seed, t + i)`` is independent of everything that
decided the prefix. Any ``k`` is accepted.
"""

from __future__ import annotations

import torch

from ...torch_backend.common import Verdict, assemble, check_inputs, check_probs
from ...torch_backend.rng import gumbel_argmax
from ...torch_backend.tree import walk_tree

__all__ = ["verify", "draft", "draft_branches", "target_tokens", "AHEAD"]

#: law entries a chain covers per call: the target's tokens at further positions are found
#: before the walk knows it reaches them, which pays while those rows cost less than a call's
#: fixed cost of small tensor operations; at B = 1, V = 49152 (five rows) the twin runs at
#: 0.98-1.04x the plain token verifier, against 0.71-1.16x with 2^17 and 1.37-1.50x with 2^19
#: (``python benchmarks/bench_twins.py --rules gumbel --k 1 --batches 1 --repeats 31``)
AHEAD = 1 << 18


def draft(
    q: torch.Tensor, seeds: torch.Tensor | int, positions: torch.Tensor | int
) -> torch.Tensor:
    """Drafter side of the Gumbel coupling: ``argmax_v log q[..., v] + G(seed, position, v)``.

    ``q`` is ``[..., V]``; ``seeds`` and ``positions`` broadcast to ``q.shape[:-1]`` (e.g. a
    ``[B]`` batch drafting the token at absolute position ``positions[b]``). The float64
    argmax, hashing only the blocks of the vocabulary that can hold it
    (:func:`~coupling.torch_backend.rng.gumbel_argmax`).
    """
    if not isinstance(q, torch.Tensor) or not q.dtype.is_floating_point or q.ndim < 1:
        raise ValueError("q must be a floating tensor [..., V] of draft probabilities")
    check_probs(q, "q")
    s = torch.as_tensor(seeds, device=q.device)
    t = torch.as_tensor(positions, device=q.device)
    s, t = torch.broadcast_tensors(s, t)
    lead, V = q.shape[:-1], q.shape[-1]
    s, t = (x.expand(lead).reshape(-1) for x in (s, t))
    return gumbel_argmax(q.reshape(-1, V), s, t).reshape(lead)


def draft_branches(q: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The drafter side as every shared-noise twin offers it: ``q [B, k, V]`` (here ``k = 1``),
    ``seeds``, ``positions`` ``[B]`` -> ``[B, k]``, each row drafting with its own keyed noise
    (:func:`draft`)."""
    return draft(q, seeds.unsqueeze(-1), positions.unsqueeze(-1))


def target_tokens(
    p_rows: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """``argmax_v log p[b, v] + G(seeds[b], positions[b], v)`` (float64), ``[B, V] -> [B]``
    (:func:`~coupling.torch_backend.rng.gumbel_argmax`: the vocabulary's blocks that can hold
    the winner are hashed, a few of them)."""
    n = p_rows.shape[0]
    seeds, positions = (torch.as_tensor(x, device=p_rows.device).expand(n)
                        for x in (seeds, positions))
    return gumbel_argmax(p_rows, seeds, positions)


def verify(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor | None = None, *,
           seeds: torch.Tensor | int, positions: torch.Tensor | int,
           noise: torch.Tensor | None = None, replacement: bool = True,
           validate: bool = True, atol: float | None = None) -> Verdict:
    """Gumbel-max coupling along a draft tree (module doc), batched.

    Emits the target's keyed Gumbel-max stream ``argmax(log p_i + G(seed, t + i))`` and
    accepts drafts while they agree with it. ``q`` is only validated (and may be None) and
    ``replacement`` is accepted for a uniform call signature: the output depends on neither.
    ``noise``: optional float64 ``[B, gamma+1, V]`` holding ``gumbel_noise(seeds, t + i, V)``
    for ``i = 0..gamma``, e.g. kept by a drafter that made whole vectors, which the walk then
    reads instead of hashing (without it each position hashes the few blocks of the
    vocabulary that can hold its token, :func:`~coupling.torch_backend.rng.gumbel_argmax`);
    or ``[B, gamma, V]``, the drafter's positions only: the bonus position's token is then
    found here, and only if the walk reaches it. The caller vouches that it is that noise.
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
        not isinstance(noise, torch.Tensor) or tuple(noise.shape) not in ((B, g + 1, V), (B, g, V))
    ):
        raise ValueError(
            f"noise must be a tensor [B, gamma+1, V] = {(B, g + 1, V)} of keyed Gumbel noise "
            "(gumbel_noise(seeds, positions + i, V) for i = 0..gamma), or [B, gamma, V] without "
            "the bonus position, or None"
        )
    if k == 1 and noise is None:
        return _chain(drafts, p, seeds, positions)
    dummy_coins = torch.zeros(B, g, k, dtype=torch.float64, device=drafts.device)
    dummy_u = torch.zeros(B, g + 1, dtype=torch.float64, device=drafts.device)

    def target_token(p_rows: torch.Tensor, act: torch.Tensor, i: int) -> torch.Tensor:
        if noise is None or i >= noise.shape[1]:
            return target_tokens(p_rows, seeds[act], positions[act] + i)
        G = noise[int(act), i].unsqueeze(0) if act.numel() == 1 else noise[act, i]
        return torch.argmax(p_rows.to(torch.float64).log() + G.to(torch.float64), -1)

    def step(p_i, q_i, x, alive, coins, u, i, act):
        return target_token(p_i, act, i)

    def bonus(p_g, u, act):
        return target_token(p_g, act, g)

    # argmax(log p + G) is the same for any positive multiple of p: the rows as they are
    return walk_tree(step, drafts, p, q, dummy_coins, dummy_u, bonus=bonus, normalise=False)


def _chain(drafts: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor,
           positions: torch.Tensor) -> Verdict:
    """One branch per request (``drafts [B, 1, g]``, ``p [B, 1, g + 1, V]``): the walk of
    :func:`verify` with the target's tokens of several positions per call (:data:`AHEAD`),
    the same verdict."""
    B, _, g = drafts.shape
    V = p.shape[-1]
    dev = drafts.device
    accepted = torch.zeros(B, dtype=torch.int64, device=dev)
    nxt = torch.zeros(B, dtype=torch.int64, device=dev)
    act, i = torch.arange(B, device=dev), 0
    while act.numel():
        A = act.numel()
        w = min(g + 1 - i, max(1, AHEAD // (A * V)))            # positions i .. i + w - 1
        offsets = torch.arange(i, i + w, device=dev)
        y = gumbel_argmax(p[act, 0, i:i + w].reshape(A * w, V), seeds[act].repeat_interleave(w),
                          (positions[act].unsqueeze(1) + offsets).flatten()).view(A, w)
        stop = torch.ones(A, w, dtype=torch.bool, device=dev)   # the bonus position stops
        d = min(w, g - i)
        stop[:, :d] = drafts[act, 0, i:i + d] != y[:, :d]
        ends, first = stop.any(1), stop.to(torch.uint8).argmax(1)
        done = act[ends]
        accepted[done] = i + first[ends]
        nxt[done] = y[ends, first[ends]]
        act, i = act[~ends], i + w
    return assemble(drafts, accepted, torch.zeros_like(accepted), nxt)
