"""``greedy``'s batched torch twin: the greedy draft law's optimal verifier at every node of the
draft tree.

At the root the ``k`` branches start with the greedy drafts ``(t_1, ..., t_{k-1}, x)``
(:mod:`coupling.rules.greedy`): the last first token ``x`` is tested against ``p`` with the law
it was drawn from, :math:`g = q\\,\\mathbf 1_{T^c} / q(T^c)`, by its own coin, and a rejection
draws from :math:`(p - g)_+`. The drafts are distinct, so every later offset has one survivor,
judged by the token rule. The arithmetic is the numpy core's (:func:`coupling.rules.greedy.verify`)
on ``[B]`` rows at once, in float64. :func:`draft_roots` draws the greedy drafts themselves, for
a batched drafter.
"""

from __future__ import annotations

import torch

from ...torch_backend.common import Verdict, check_inputs, sample_rows
from ...torch_backend.tree import StepFn, first_true, verify_tree
from . import RULE

__all__ = ["verify", "step", "check_greedy_roots", "draft_roots", "make_step"]


def step(p_i, q_i, x, alive, coins, u, i, act):
    """The single-step rule on the unfinished rows (:data:`coupling.torch_backend.tree.StepFn`):
    the last survivor is the sampled draft, the others (if any) the top tokens."""
    B, k = x.shape
    rows = torch.arange(B, device=x.device)
    last = k - 1 - first_true(alive.flip(-1))                       # [B] the sampled draft
    xs = x[rows, last]
    p, q = p_i.to(torch.float64), q_i.to(torch.float64)
    top = alive.clone()
    top[rows, last] = False
    # g: q off the top drafts, renormalised by its own sum; q itself for a lone survivor
    off = q.scatter(1, x, torch.where(top, 0.0, q.gather(1, x)))
    g = torch.where(top.any(-1, keepdim=True), off / off.sum(-1, keepdim=True), q)
    accept = coins[rows, last] * g[rows, xs] < p[rows, xs]
    res = (p - g).clamp_(min=0.0)
    empty = res.sum(-1) <= 0                  # p == g: a rejection has probability 0
    return torch.where(accept | empty, xs, sample_rows(res, u, fallback=p))



def make_step(replacement: bool = True) -> StepFn:
    """The walk's kernel (:data:`coupling.torch_backend.tree.StepFn`): :func:`step`, whatever
    the draft law."""
    return step

def draft_roots(q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The greedy drafts of each row of ``q [B, V]`` with the uniforms ``u [B, k]``, int64
    ``[B, k]``: the ``k - 1`` likeliest tokens (ties by the smaller id), then the inverse-CDF
    draw with ``u[:, k - 1]`` from ``q`` off them (the numpy draw's one uniform; the others are
    not read). Each row needs ``k`` tokens of positive probability."""
    k = u.shape[1]
    top = torch.sort(q, dim=-1, descending=True, stable=True).indices[:, : k - 1]
    rest = q.to(torch.float64).scatter(1, top, 0.0)
    return torch.cat([top, sample_rows(rest, u[:, k - 1]).unsqueeze(1)], 1)


def check_greedy_roots(drafts: torch.Tensor, q: torch.Tensor) -> None:
    """``ValueError`` unless every request's first ``k - 1`` first tokens are likeliest tokens
    of its root draft law and the last one is none of them (``drafts [B, k, g]``,
    ``q [B, k, g, V]``, ``k >= 2``, ``g >= 1``)."""
    B, k, _ = drafts.shape
    q0 = q[:, 0, 0].to(torch.float64)                                # [B, V]
    top, x = drafts[:, : k - 1, 0], drafts[:, k - 1, 0]
    on_top = torch.zeros_like(q0, dtype=torch.bool).scatter(1, top, True)
    low = q0.gather(1, top).min(-1).values
    high = torch.where(on_top, -1.0, q0).max(-1).values
    bad = (low < high) | on_top.gather(1, x.unsqueeze(1)).squeeze(1) \
        | (on_top.sum(-1) != k - 1)
    if bool(bad.any()):
        b = int(torch.nonzero(bad)[0])
        raise ValueError(f"request {b}: first tokens {drafts[b, :, 0].tolist()} are no greedy "
                         f"draft tuple: branches 0..{k - 2} must hold likeliest tokens of q and "
                         f"branch {k - 1} another token (sampled from the rest)")


def verify(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor, *,
           seeds: torch.Tensor | int, positions: torch.Tensor | int,
           replacement: bool = True, accept_u: torch.Tensor | None = None,
           sample_u: torch.Tensor | None = None, validate: bool = True,
           atol: float | None = None) -> Verdict:
    """The greedy law's verifier over draft trees, batched (arguments as
    :func:`coupling.rules.rrs.torch.verify`). The ``k`` first tokens must be greedy drafts,
    distinct: ``replacement=False`` (``True`` is refused for ``k >= 2``, as by the numpy
    core)."""
    drafts, p, q, seeds, positions = check_inputs(drafts, p, q, seeds, positions,
                                                  validate=validate, atol=atol, rule="greedy")
    RULE.require(drafts.shape[1], replacement)
    if drafts.shape[1] > 1 and validate and drafts.shape[2] > 0:
        check_greedy_roots(drafts, q)
    return verify_tree(step, drafts, p, q, seeds, positions, replacement=False, validate=False,
                       atol=atol, accept_u=accept_u, sample_u=sample_u, rule="greedy")
