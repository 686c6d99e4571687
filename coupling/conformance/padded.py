r"""Token verification of a padded, mixed batch, written the way serving engines write it: the
reference for the ragged and greedy protocols of :func:`~coupling.conformance.from_torch`, and
two bugs of that code path as negative controls.

Glossary (shapes in comments below)
-----------------------------------
``B`` requests, ``G`` the longest draft in the batch, ``V`` ids. ``num_drafts[b] <= G``: request
``b``'s own draft length; positions past it are padding and may hold anything. ``greedy[b]``:
request ``b`` decodes greedily (temperature 0): it accepts a draft iff it is the target's argmax
and then emits the argmax. Sampled requests run token verification (Leviathan et al., arXiv
2211.17192): accept draft ``x_i`` iff ``u_i q_i(x_i) < p_i(x_i)``, the first rejection at ``i``
emits a draw from ``norm(max(p_i - q_i, 0))``, and a request that accepts all its drafts emits
the bonus token from ``p`` at its own position ``num_drafts[b]``.

The two controls are the mistakes this layout invites, as flags of one function:

* ``bonus_from="last"``: the bonus token is drawn at position ``G`` for every request, which for a
  shorter request is padding;
* ``greedy_batch="any"``: a batch holding one greedy request is verified greedily as a whole
  (the "all greedy" fast path taken on ``any`` instead of ``all``).

>>> import numpy as np
>>> from coupling.conformance import check_verifier, from_torch
>>> fine = from_torch(padded_token_verifier, ragged=True, greedy=True)
>>> check_verifier(fine, draws=2048, seed=1).ok
True
>>> check_verifier(from_torch(padded_bonus_from_last, ragged=True), draws=2048, seed=1).ok
False
"""

from __future__ import annotations

from functools import partial

__all__ = ["padded_token_verifier", "padded_bonus_from_last", "greedy_when_any_row_is"]


def padded_token_verifier(drafts, p, q, generator, *, num_drafts=None, greedy=None,
                          bonus_from: str = "own", greedy_batch: str = "rows"):
    """Verify a padded batch of one-branch drafts (module doc); returns ``(accepted,
    branch, next_token)``, each ``[B]``.

    drafts      int64 [B, 1, G]
    p           float [B, 1, G + 1, V]   target laws along the drafts, then the bonus law
    q           float [B, 1, G, V]       draft laws
    num_drafts  int64 [B] or None        each request's drafts (None: all G)
    greedy      bool  [B] or None        the greedy requests (None: none)
    """
    import torch

    if drafts.shape[1] != 1:
        raise ValueError(f"padded_token_verifier verifies one branch per request (k = 1), "
                         f"got drafts of shape {tuple(drafts.shape)}")
    x, P, Q = drafts[:, 0], p[:, 0].float(), q[:, 0].float()  # [B, G], [B, G+1, V], [B, G, V]
    B, G = x.shape
    rows = torch.arange(B, device=x.device)
    n = torch.full((B,), G, device=x.device) if num_drafts is None else num_drafts.long()
    g = torch.zeros(B, dtype=torch.bool, device=x.device) if greedy is None else greedy.bool()
    if greedy_batch == "any" and bool(g.any()):
        g = torch.ones_like(g)
    live = torch.arange(G, device=x.device)[None, :] < n[:, None]            # [B, G]
    px = P[:, :G].gather(-1, x[..., None])[..., 0]                            # [B, G]
    qx = Q.gather(-1, x[..., None])[..., 0]                                   # [B, G]
    u = torch.rand(B, G, generator=generator, device=x.device)                # [B, G]
    ok = torch.where(g[:, None], x == P[:, :G].argmax(-1), u * qx < px) & live
    accepted = ok.long().cumprod(-1).sum(-1)                                  # [B]
    at = torch.where(accepted < n, accepted, n if bonus_from == "own" else torch.full_like(n, G))
    target = P[rows, at]                                                      # [B, V]
    residual = (target - Q[rows, at.clamp(max=G - 1)]).clamp(min=0.0)
    weights = torch.where((accepted < n)[:, None] & (residual.sum(-1) > 0)[:, None],
                          residual, target)
    drawn = torch.multinomial(weights, 1, generator=generator)[:, 0]
    next_token = torch.where(g, target.argmax(-1), drawn)
    return accepted, torch.zeros_like(accepted), next_token


#: Control: the bonus token of every request drawn at the batch's last position ``G``.
padded_bonus_from_last = partial(padded_token_verifier, bonus_from="last")
#: Control: the whole batch verified greedily when one request is greedy.
greedy_when_any_row_is = partial(padded_token_verifier, greedy_batch="any")
