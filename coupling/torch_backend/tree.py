r"""The batched walk of a draft tree: how every single-step rule's torch twin verifies blocks.

The semantics are those of :mod:`coupling.rules.walk` (the numpy reference): at offset ``i``
the surviving branches' tokens are i.i.d. draws from ``q_i`` along the emitted prefix, the
rule's single-step coupling emits ``y_i`` with law ``p_i``, the survivors shrink to the
branches that drafted ``y_i``, and the first token no survivor drafted ends the call; survivors
at the end get the bonus token. Here every quantity is a ``[B]`` or ``[B, k]`` tensor; the only
Python loop is over the ``gamma`` offsets.

Randomness (:mod:`coupling.keyed`), with ``t = positions[b]`` the absolute position of the first
drafted token: branch ``j``'s coin at offset ``i`` is ``U(seed, t, STREAM_ACCEPT,
i * MAX_DRAFTS + j)`` and the token emitted at offset ``i`` (residual, plan row or bonus) is drawn
from ``U(seed, t, STREAM_SAMPLE, i)``: the numbers :func:`coupling.keyed.call_uniforms` gives
the numpy walk.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .common import Verdict, assemble, check_inputs, coin_uniforms, sample_rows, sample_uniforms
from .laws import normalised_rows, rows
from .rng import call_uniforms

__all__ = ["StepFn", "walk_tree", "prepare_tree", "verify_tree", "first_true"]

# A single-step rule on the A unfinished rows: (p_i [A,V], q_i [A,V], x [A,k], alive [A,k],
# coins [A,k], u [A], offset i, batch rows act [A]) -> output token y [A]. With the walk's
# default normalise=True, p_i and q_i are float64 rows of the normalised laws, fresh for the
# call (the step may overwrite them).
StepFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int,
     torch.Tensor],
    torch.Tensor,
]


def first_true(mask: torch.Tensor) -> torch.Tensor:
    """Index of the first True along the last axis (0 if none). ``[B, k] -> [B]``."""
    return mask.to(torch.uint8).argmax(-1)


def _laws_at(act: torch.Tensor, ref: torch.Tensor, i: int, *laws: torch.Tensor,
             normalise: bool = False):
    """``law[act, ref, i]`` ``[A, V]`` for each law: with ``normalise``, float64 rows divided
    by their sums (:func:`.laws.normalised_rows`); else :func:`.laws.rows` (a view for one
    row on a CPU: a step that reads a few entries copies no V-vector)."""
    if normalise:
        index = (act, ref, torch.full_like(act, i))
        return tuple(normalised_rows(law, index) for law in laws)
    return tuple(rows(law, (act, ref, i)) for law in laws)


def walk_tree(
    step: StepFn,
    drafts: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    coins: torch.Tensor,
    u_sample: torch.Tensor,
    bonus: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    *,
    normalise: bool = True,
) -> Verdict:
    """Walk the draft tree (module doc) with a single-step rule ``step``.

    ``drafts [B,k,g]``, ``p [B,k,g+1,V]``, ``q [B,k,g,V]``, ``coins [B,g,k]``, ``u_sample [B,g+1]``.
    ``bonus(p_g [A,V], u [A], act [A]) -> [A]`` draws the bonus token of the unfinished
    rows ``act`` (default: inverse CDF with ``u``, which no scale changes). ``normalise``:
    hand ``step`` and ``bonus`` float64 rows of the normalised laws ``p / sum p``,
    ``q / sum q`` (:mod:`.laws`), so a rule's arithmetic is exact for laws of any precision;
    ``False`` hands the rows as they are (for rules that no scale changes, e.g. a Gumbel
    argmax).
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
        ref = first_true(al)  # [A] lowest surviving branch: its laws are the prefix's laws
        x = drafts[act, :, i]  # [A, k]
        y = step(*_laws_at(act, ref, i, p, q, normalise=normalise), x, al, coins[act, i],
                 u_sample[act, i], i, act)
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
        ref = first_true(alive[act])
        u_end = u_sample[act, g]
        if bonus is None:  # the inverse CDF reads the raw row: no scale changes its draw
            nxt[act] = sample_rows(*_laws_at(act, ref, g, p), u_end)
        else:
            nxt[act] = bonus(*_laws_at(act, ref, g, p, normalise=normalise), u_end, act)
        branch[act] = ref
    return assemble(drafts, accepted, branch, nxt)


def prepare_tree(drafts, p, q, seeds, positions, *, replacement: bool, validate: bool,
                 atol: float | None, accept_u: torch.Tensor | None,
                 sample_u: torch.Tensor | None, rule: str):
    """What every tree twin does first: validate (:func:`check_inputs`; with
    ``replacement=False``, ``k`` distinct first tokens), then draw the keyed uniforms or take
    ``accept_u [B, gamma, k]`` / ``sample_u [B, gamma + 1]``. Returns ``(drafts, p, q, coins,
    u)``."""
    drafts, p, q, seeds, positions = check_inputs(drafts, p, q, seeds, positions,
                                                  validate=validate, atol=atol, rule=rule)
    B, k, g = drafts.shape
    if not replacement and validate and k > 1 and g > 0:
        first = drafts[:, :, 0].sort(-1).values
        if bool((first[:, 1:] == first[:, :-1]).any()):
            raise ValueError("replacement=False promises k distinct first tokens (successive "
                             "sampling), but some request repeats one; pass replacement=True "
                             "for i.i.d. branches")
    if accept_u is None and sample_u is None:  # the keyed ones, both streams in one pass
        coins, u = call_uniforms(seeds, positions, g, k)
    else:
        coins = coin_uniforms(seeds, positions, g, k) if accept_u is None \
            else accept_u.to(torch.float64)
        u = sample_uniforms(seeds, positions, g) if sample_u is None \
            else sample_u.to(torch.float64)
    if coins.shape != (B, g, k) or u.shape != (B, g + 1):
        raise ValueError(f"accept_u must be [B, gamma, k] = {(B, g, k)} and sample_u "
                         f"[B, gamma+1] = {(B, g + 1)}")
    return drafts, p, q, coins, u


def verify_tree(step: StepFn, drafts, p, q, seeds, positions, *, replacement: bool,
                validate: bool, atol: float | None, accept_u: torch.Tensor | None,
                sample_u: torch.Tensor | None, rule: str) -> Verdict:
    """A single-step rule's twin: :func:`prepare_tree`, then walk the tree."""
    drafts, p, q, coins, u = prepare_tree(drafts, p, q, seeds, positions,
                                          replacement=replacement, validate=validate,
                                          atol=atol, accept_u=accept_u, sample_u=sample_u,
                                          rule=rule)
    return walk_tree(step, drafts, p, q, coins, u)
