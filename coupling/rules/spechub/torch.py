"""``spechub``'s batched torch twin: the hub pair's staged plan at the root of the draft tree.

At the root the two branches start with a hub pair (:mod:`coupling.rules.spechub`): one first
token is the hub ``a = argmax q`` (ties: the smaller id), the other a token ``i``. The staged
plan's quantities (``c``, ``p'``, ``L_1``, ``L_2``, ``p'_a`` and the residual) are computed for
``[B]`` rows at once in float64, and the numpy core's tests run on them: ``i`` with its own
coin, then the hub with the other coin, then the residual draw. The drafts are distinct, so
every later offset has one survivor, judged by the token rule. :func:`draft_roots` draws hub
pairs, for a batched drafter.
"""

from __future__ import annotations

import torch

from ...torch_backend.common import Verdict, check_inputs, sample_rows
from ...torch_backend.laws import by_row_chunks
from ...torch_backend.rejection import judge
from ...torch_backend.tree import StepFn, verify_tree
from . import RULE

__all__ = ["verify", "step", "check_hub_roots", "draft_roots", "make_step"]


def _hub_pair(p, q, x, alive, coins, u):
    """The staged plan on rows whose two survivors ``x [R, 2]`` form a hub pair (``alive``
    unused: both survive). The hub's entries are zeroed by index, not by a mask in every
    whole-row pass."""
    R = x.shape[0]
    rows = torch.arange(R, device=x.device)
    a = q.argmax(-1)                                               # [R] hub, first maximum
    qa, pa = q[rows, a], p[rows, a]
    # c = q_a (q / q(off the hub)), 0 at the hub, in the numpy core's order (q_a / q(off)
    # overflows where the rest is subnormal); sums over the tokens off the hub are taken with
    # the hub's entry zeroed, not as the total less it (which cancels when q_a ~ 1)
    c = q.clone()
    c[rows, a] = 0.0
    rest = c.sum(-1)
    c.div_(torch.where(rest > 0, rest, 1.0).unsqueeze(1)).mul_(qa.unsqueeze(1))
    p1 = (p - q).clamp_(min=0.0)
    p1[rows, a] = 0.0
    up = (q - p).clamp_(min=0.0)
    up[rows, a] = 0.0
    L1 = up.sum(-1)
    L2 = (c - p1).clamp_(min=0.0).sum(-1)
    pa1 = (pa - L2).clamp(min=0.0)
    pp = p1.sub_(c).clamp_(min=0.0)                                # p1 is read no more below
    hub_second = x[:, 1] == a
    i = torch.where(hub_second, x[:, 0], x[:, 1])                  # the non-hub draft
    c_i, c_h = (torch.where(hub_second, coins[:, 0], coins[:, 1]),
                torch.where(hub_second, coins[:, 1], coins[:, 0]))
    p1_i = (p[rows, i] - q[rows, i]).clamp(min=0.0)
    take_i = torch.where(hub_second, c_i * q[rows, i] < p[rows, i], c_i * c[rows, i] < p1_i)
    take_a = torch.where(hub_second, c_h * L1 < pa1, c_h * L2 < pa)
    pp[rows, a] = (pa1 - L1).clamp(min=0.0)
    resid = sample_rows(pp, u, fallback=p)
    return torch.where(take_i, i, torch.where(take_a, a, resid))


def step(p_i, q_i, x, alive, coins, u, i, act):
    """The single-step rule on the unfinished rows (:data:`coupling.torch_backend.tree.StepFn`):
    a hub pair at the root, the token rule for a lone survivor; a chunk of rows at a time
    (:func:`~coupling.torch_backend.laws.by_row_chunks`), so its float64 temporaries never hold
    more than a chunk."""
    return by_row_chunks(_step_rows, p_i.shape[-1], p_i, q_i, x, alive, coins, u)



def make_step(replacement: bool = True) -> StepFn:
    """The walk's kernel (:data:`coupling.torch_backend.tree.StepFn`): :func:`step`, whatever
    the draft law."""
    return step

def _step_rows(p_i, q_i, x, alive, coins, u):
    p, q = p_i.to(torch.float64), q_i.to(torch.float64)
    pair = alive.sum(-1) == 2
    y = torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
    for idx, rule in ((torch.nonzero(~pair).squeeze(1), judge),   # one survivor: token rule
                      (torch.nonzero(pair).squeeze(1), _hub_pair)):
        if idx.numel() == x.shape[0]:
            return rule(p, q, x, alive, coins, u)
        if idx.numel():
            y[idx] = rule(p[idx], q[idx], x[idx], alive[idx], coins[idx], u[idx])
    return y


def draft_roots(q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """A hub pair per row of ``q [B, V]`` with the uniforms ``u [B, 2]``, int64 ``[B, 2]``:
    ``x_1`` by inverse CDF with ``u[:, 0]``; the pair is ``(x_1, a)`` unless ``x_1`` is the hub
    ``a = argmax q`` (the first maximum), then ``(a, x_2)`` with ``x_2`` drawn from ``q`` off the
    hub with ``u[:, 1]`` (the numpy draw's uniforms, in order). Each row needs two tokens of
    positive probability."""
    if u.ndim != 2 or u.shape[1] != 2:
        raise ValueError(f"spechub drafts a hub pair: u must be [B, 2], got {tuple(u.shape)}")
    a = q.argmax(-1)
    x1 = sample_rows(q, u[:, 0])
    x2 = sample_rows(q.to(torch.float64).scatter(1, a.unsqueeze(1), 0.0), u[:, 1])
    hub_first = x1 == a
    return torch.stack([x1, torch.where(hub_first, x2, a)], 1)


def check_hub_roots(drafts: torch.Tensor, q: torch.Tensor) -> None:
    """``ValueError`` unless exactly one of every request's two first tokens is the hub of its
    root draft law (``drafts [B, 2, g]``, ``q [B, 2, g, V]``, ``g >= 1``)."""
    a = q[:, 0, 0].argmax(-1)
    is_hub = drafts[:, :, 0] == a.unsqueeze(1)
    bad = is_hub.sum(-1) != 1
    if bool(bad.any()):
        b = int(torch.nonzero(bad)[0])
        raise ValueError(f"request {b}: first tokens {drafts[b, :, 0].tolist()} are no hub "
                         f"pair: exactly one must be the hub {int(a[b])} (the likeliest token "
                         "of q, ties by smaller id)")


def verify(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor, *,
           seeds: torch.Tensor | int, positions: torch.Tensor | int,
           replacement: bool = True, accept_u: torch.Tensor | None = None,
           sample_u: torch.Tensor | None = None, validate: bool = True,
           atol: float | None = None) -> Verdict:
    """SpecHub over draft trees of ``k <= 2`` branches, batched (arguments as
    :func:`coupling.rules.rrs.torch.verify`). Two branches must start with a hub pair, distinct:
    ``replacement=False`` (``True`` is refused for ``k = 2``, as by the numpy core)."""
    drafts, p, q, seeds, positions = check_inputs(drafts, p, q, seeds, positions,
                                                  validate=validate, atol=atol, rule="spechub")
    RULE.require(drafts.shape[1], replacement)
    if drafts.shape[1] == 2 and validate and drafts.shape[2] > 0:
        check_hub_roots(drafts, q)
    return verify_tree(step, drafts, p, q, seeds, positions, replacement=False, validate=False,
                       atol=atol, accept_u=accept_u, sample_u=sample_u, rule="spechub")
