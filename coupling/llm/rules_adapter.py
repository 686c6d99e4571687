"""The engine's only door to the rules: :data:`coupling.rules.RULES`.

``decide`` verifies one request's block (``k`` branches) with a rule. On a CPU it calls the
rule's numpy core openly (:meth:`coupling.rules.base.Rule.verify_block`), fed the keyed
uniforms the batched twin would draw for this request (the rule's ``call_uniforms``):
one request's compressed laws hold a few hundred entries, where a numpy step costs about a
microsecond against 5-15 for a torch operation (``python benchmarks/bench_decide.py``); on a
GPU it calls the batched twin (:func:`coupling.verify`). ``sample_target`` is the plain sampler
used when nothing is drafted (and by the autoregressive baseline): inverse CDF with the keyed
uniform ``U(seed, t, STREAM_SAMPLE, 0)``, or, for ``gumbel``, ``argmax(log p + G(seed, t))``
with the keyed Gumbel noise, so that under one seed plain sampling and gumbel verification emit
the same stream whatever the drafter (drafter invariance). ``gls`` is verified the same way
(its list columns belong to the drafter; with any other drafter it stays lossless and
invariant, at a lower acceptance), and ``strict`` draws the target's token at each absolute
position with that same plain-sampling uniform.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from coupling import keyed
from coupling.dist import tuple_law, validate_k, validate_replacement
from coupling.rules import RULES
from coupling.tree import Tree

PLAIN = "plain"

#: rules that verify one draft chain (k = 1) and those that verify k branches
SINGLE_DRAFT_RULES = tuple(n for n, r in RULES.items() if r.max_drafts == 1)
MULTI_DRAFT_RULES = tuple(n for n, r in RULES.items() if r.max_drafts != 1)


def check_rule(rule: str, k: int = 1, replacement: bool = True, *,
               lossy: bool = False) -> None:
    """``ValueError`` unless the engine runs ``rule`` on ``k`` branches of this draft law.

    ``rule`` is a name of :data:`coupling.rules.RULES` (or ``"plain"``: plain sampling); the
    rule must take ``k`` drafts with ``replacement`` (i.i.d. branches, or ``False``: k
    distinct first tokens by successive sampling), which are the only draft laws the
    engine's drafters draw: a rule with a draft law of its own (greedy's top tokens, spechub's
    hub) is refused at any ``k`` where that law differs from both. A lossy rule
    (``lossless`` False) runs only with ``lossy=True``, the caller's label that its output is
    not the target's law.
    """
    if rule == PLAIN:
        return
    if not isinstance(rule, str) or rule not in RULES:
        raise ValueError(f"rule={rule!r}: choose one of {', '.join(RULES)} (or {PLAIN!r})")
    r = RULES[rule]
    k, replacement = validate_k(k), validate_replacement(replacement)
    if not r.supports(k, replacement):
        raise ValueError(f"rule={rule!r} does not take k={k}, replacement={replacement}: "
                         f"{r.support_text}")
    if not drafts_like_the_engine(rule, k, replacement):
        raise ValueError(f"rule={rule!r} at k={k} verifies drafts of its own law ({r.title}); "
                         "the engine's drafters draw i.i.d. or distinct branches from q, so "
                         "they cannot feed it: use k=1 or another rule")
    if not r.lossless and not lossy:
        raise ValueError(f"rule={rule!r} is lossy: its output is not the target's law "
                         f"(RULES[{rule!r}].distortion gives by how much); pass lossy=True to "
                         "run it labelled lossy")


@functools.cache
def drafts_like_the_engine(rule: str, k: int, replacement: bool) -> bool:
    """Whether ``RULES[rule].draft_law`` at ``(k, replacement)`` is the tuple law the engine
    draws (:func:`coupling.dist.tuple_law`: i.i.d., or successive sampling).

    Compared exactly on a probe law with distinct probabilities, at ``n = min(k, 6)`` drafts
    over ``n + 1`` tokens for distinct drafts (the enumeration has ``(n + 1)!`` tuples; on
    ``n`` tokens a hub law and successive sampling coincide at n = 2) and 2 for i.i.d. ones."""
    if k == 1 or RULES[rule].unit == "block":
        return True    # one draft is a draw from q; a block rule judges trees drawn from q
    n = min(k, 6)
    q = np.arange(2 if replacement else n + 1, 0, -1, dtype=np.float64) ** 2
    q /= q.sum()
    got, want = (
        {tuple(t): w for t, w in zip(tuples.tolist(), probs.tolist(), strict=True) if w > 0}
        for tuples, probs in (RULES[rule].draft_law(q, n, replacement=replacement),
                              tuple_law(q, n, replacement=replacement)))
    return got.keys() == want.keys() and all(abs(got[t] - want[t]) <= 1e-12 for t in got)


def distinct_first(replacement: bool, k: int) -> bool:
    """Whether the drafter draws the k first tokens without replacement."""
    return not replacement and k > 1


def prepare(rule: str) -> None:
    """Import what a rule's rare paths need, before a run times anything: the optimal rules
    solve a part of their plan by POT's LP where its closed form fails (about 1 call in 100
    on real laws), and importing POT then would cost 0.4 s in the middle of a run."""
    if rule != PLAIN and RULES[rule].solves_lp:
        import ot  # noqa: F401


def support(*laws: torch.Tensor) -> torch.Tensor:
    """Sorted int64 ids of the tokens with positive mass in any row of any law [..., V]."""
    return checked_support(*laws)[0]


def checked_support(*laws: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(:func:`support`, ok): ok is False when some entry of some law is NaN, infinite or
    negative. Such an entry lies outside the support, so a rule handed only the support's
    entries would never see it: callers must then check the full laws (and fail loudly)."""
    if all(law.device.type == "cpu" and law.dtype == torch.float32 for law in laws):
        from .sampling import native_function

        fn = native_function("union_support")       # one pass, no [V] temporaries
        if fn is not None:
            ids, ok = fn([law.contiguous() for law in laws])
            if ok:                                   # else a NaN, inf or negative entry:
                return ids, True                     # the path below finds the ids
    top, low = torch.zeros(laws[0].shape[-1], device=laws[0].device), None
    for law in laws:
        if law.numel() == 0:
            continue
        flat = law.reshape(-1, law.shape[-1])
        m = flat.amax(0)                             # one float reduction: 3x faster than any()
        top = torch.maximum(top, m)                  # NaN propagates, as +inf does
        lo = flat.amin()
        low = lo if low is None else torch.minimum(low, lo)
    ok = bool(torch.isfinite(top).all()) and (low is None or bool(low >= 0))
    return (top > 0).nonzero().squeeze(-1), ok


_OFF_SUPPORT = ("drafts: a drafted token has q = 0 and p = 0, outside the support of the laws; "
                "drafts must be sampled from q")


def decide(rule: str, drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor, seed: int,
           position: int, *, replacement: bool = True,
           compress: bool = True) -> tuple[int, int, list[int]]:
    """Verify one request's k branches.

    drafts int64 [k, g], q float32 [k, g, V], p float32 [k, g+1, V];
    returns (accepted m, chosen branch c, emitted tokens = m drafted tokens + next token).

    ``compress``: hand the rule only the U tokens where some p or q has mass (U <= k (2g + 1)
    x 50 under top-k 50, against V = 49152), renumbered in vocabulary order, and map its
    tokens back. The rules read p and q only through their values and sample residuals by
    inverse CDF in vocabulary order, where tokens of zero mass add nothing, so the decisions
    are those on the full vocabulary (``tests/test_engine.py`` checks it rule by rule).
    ``gumbel``, the one rule keyed by token ids, gets the keyed noise of the kept tokens
    (the very entries of the full vectors).
    """
    from coupling.torch_backend import check_inputs

    if rule == PLAIN:
        raise ValueError(f"rule={PLAIN!r} samples without drafts; decide needs a rule of "
                         "coupling.rules.RULES")
    # lossy rules are labelled by the caller (generate's lossy=); decide verifies what it gets
    check_rule(rule, drafts.shape[0] if drafts.dim() == 2 else 1, replacement, lossy=True)
    # what compression would blur: the ids' type and the shared vocabulary (the rule checks
    # every other shape and value, on the compressed laws)
    if drafts.dtype.is_floating_point or drafts.dtype == torch.bool:
        raise ValueError(f"drafts must hold integer token ids (int64), got dtype {drafts.dtype}")
    if p.shape[-1] != q.shape[-1]:
        raise ValueError(f"p and q must share one vocabulary (their last axis): p has "
                         f"{p.shape[-1]} entries, q {q.shape[-1]}")
    V, idx = p.shape[-1], None
    if compress:
        drafts, p, q, idx = _compressed(drafts, p, q)
    if p.device.type == "cpu":
        m, c, y = _decide_numpy(rule, replacement, drafts, p, q, seed, position, idx)
        toks = drafts[c, :m].tolist() + [y]
    else:
        check_inputs(drafts[None], p[None], q[None], seed, position)
        kwargs = {"replacement": replacement}
        if shares_noise(rule):
            kwargs["noise"] = _gumbel_noise_torch(seed, position, drafts.shape[1], V, idx, p)
        verdict = RULES[rule].torch.verify(drafts[None], p[None], q[None], seeds=seed,
                                           positions=position, **kwargs)
        m, c = int(verdict.accepted[0]), int(verdict.branch[0])
        toks = verdict.tokens[0, : m + 1].tolist()
    if idx is not None:
        toks = idx[torch.tensor(toks, dtype=torch.int64, device=idx.device)].tolist()
    return m, c, toks


def _compressed(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor):
    """``(drafts, p, q, idx)`` on the laws' support ``idx`` (drafts renumbered into it), or
    the inputs and ``None`` where some entry is NaN, infinite or negative (it lies outside
    every support: the caller names it on the full laws)."""
    idx, ok = checked_support(p, q)
    if not ok:
        return drafts, p, q, None
    x = torch.searchsorted(idx, drafts).clamp_(max=max(idx.numel() - 1, 0))
    if idx.numel() == 0 or not torch.equal(idx[x], drafts):
        raise ValueError(_OFF_SUPPORT)
    return x, p[..., idx], q[..., idx], idx


def decide_tree(rule: str, tree: Tree, drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                seed: int, position: int) -> tuple[int, int, list[int]]:
    """Verify one request's static draft tree of any shape.

    drafts int64 [N] in node order, q and p float32 [N + 1, V] (row 0 the root's laws, row
    ``1 + n`` those after node ``n``: :mod:`coupling.rules.topology`); returns (accepted m,
    deepest accepted node (-1: none), emitted tokens = m drafted tokens + next token). The
    laws are compressed to their support as in :func:`decide`; on a CPU the rule's numpy walk
    runs with the keyed numbers its twin draws (:func:`coupling.rules.topology.tree_uniforms`),
    elsewhere the twin (:func:`coupling.verify` with ``tree=``).
    """
    from coupling.rules.topology import check_tree_rule, tree_uniforms, walk_topology

    if rule == PLAIN or rule not in RULES:
        raise ValueError(f"rule={rule!r}: decide_tree needs a rule of coupling.rules.RULES")
    r = RULES[rule]
    check_tree_rule(r, tree)
    if drafts.shape != (tree.size,) or p.shape != q.shape or p.shape[0] != tree.size + 1:
        raise ValueError(f"a {tree.size}-node tree takes drafts [N] and p, q [N + 1, V]; got "
                         f"{tuple(drafts.shape)}, {tuple(p.shape)}, {tuple(q.shape)}")
    drafts, p, q, idx = _compressed(drafts, p, q)
    if idx is None:     # a bad entry, named on the full laws: the numpy walk reads them as is
        from coupling.torch_backend import check_probs

        check_probs(p, "p")
        check_probs(q, "q")
    if p.device.type == "cpu":
        coins, u = tree_uniforms(r, seed, position, tree)
        m, node, y = walk_topology(r, tree, drafts.numpy(), p.detach().numpy(),
                                   q.detach().numpy(), coins, u)
        toks = drafts[tree.path_to(node)].tolist() + [y]
    else:
        from coupling.rules import verify

        v = verify(r, drafts[None], p[None], q[None], tree=tree, seeds=seed, positions=position)
        m, node = int(v.accepted[0]), int(v.branch[0])
        toks = v.tokens[0, : m + 1].tolist()
    if idx is not None:
        toks = idx[torch.tensor(toks, dtype=torch.int64, device=idx.device)].tolist()
    return m, node, toks


def _decide_numpy(name: str, replacement: bool, drafts: torch.Tensor, p: torch.Tensor,
                  q: torch.Tensor, seed: int, position: int,
                  idx: torch.Tensor | None) -> tuple[int, int, int]:
    """The rule's numpy core on one request, with the keyed uniforms its twin would draw."""
    k, g = drafts.shape
    d = drafts.numpy()
    P, Q = p.detach().numpy(), q.detach().numpy()
    rule = RULES[name]
    if shares_noise(name):
        tokens = np.arange(P.shape[-1]) if idx is None else idx.numpy()
        noise = keyed.gumbel_noise(seed, position + np.arange(g + 1), tokens)
        return rule.verify_block(d, P, Q, noise, replacement=replacement)
    coins, u = rule.call_uniforms(seed, position, g, k)
    return rule.verify_block(d, P, Q, coins, u, replacement=replacement)


def _gumbel_noise_torch(seed: int, position: int, g: int, V: int, idx: torch.Tensor | None,
                        p: torch.Tensor) -> torch.Tensor:
    """``[1, g + 1, U]`` keyed noise of the kept tokens ``idx`` (all ``V`` if None)."""
    from coupling.torch_backend import gumbel_noise

    return gumbel_noise(torch.tensor(seed, device=p.device),
                        position + torch.arange(g + 1, device=p.device), V, tokens=idx,
                        dtype=torch.float64, device=p.device)[None]


def _gumbel_argmax(law: torch.Tensor, seed: int, position: int, name: str) -> torch.Tensor:
    """argmax_v log law[r, v] + G(seed, position, v) per row r of law [rows, V] (float64):
    :func:`coupling.torch_backend.rng.gumbel_argmax`, which hashes only the blocks of the
    vocabulary that can hold the winner."""
    from coupling.torch_backend import check_probs, gumbel_argmax

    check_probs(law, name)      # else a NaN or negative entry would simply never win
    rows = law.shape[0]
    return gumbel_argmax(law, torch.full((rows,), seed, device=law.device),
                         torch.full((rows,), position, device=law.device))


def sample_target(rule: str, p: torch.Tensor, seed: int, position: int,
                  gen: torch.Generator | None = None) -> int:
    """Plain sample from p [1, V] keyed by (seed, position) (see module docstring).

    p is checked first (finite, non-negative, rows summing to 1), as the rules check theirs:
    the inverse-CDF draw would turn a NaN law into some token without a word."""
    from coupling.keyed import STREAM_SAMPLE
    from coupling.torch_backend import check_probs, uniforms

    from .sampling import sample_rows

    if shares_noise(rule):
        return int(_gumbel_argmax(p, seed, position, "p")[0])
    check_probs(p, "p")
    seeds = torch.tensor([seed], device=p.device)
    pos = torch.tensor([position], device=p.device)
    u = uniforms(seeds, pos, 1, stream=STREAM_SAMPLE, device=p.device)[:, 0]
    return int(sample_rows(p, u)[0])


def gumbel_draft(q: torch.Tensor, seed: int, position: int) -> torch.Tensor:
    """Drafter side of the Gumbel coupling: argmax(log q + G(seed, position)) per row of
    q [rows, V], every row keyed by the same (seed, position)."""
    return _gumbel_argmax(q, seed, position, "q")


def has_path_law(rule: str) -> bool:
    """Whether ``rule`` judges one chain with an exact law given the drafted path
    (``rule.path_law``: ``token``, ``block``), so a step's E[tokens | drafts] is exact."""
    return rule != PLAIN and callable(getattr(RULES[rule], "path_law", None))


def shares_noise(rule: str) -> bool:
    """Whether ``rule`` verifies by the target's keyed Gumbel noise (``rule.shared_noise``)."""
    return rule != PLAIN and RULES[rule].shared_noise


def noise_draft(q: torch.Tensor, rule: str, seed: int, position: int) -> torch.Tensor:
    """The drafts of a shared-noise rule at one position: ``q [k, V]`` -> ``[k]``, branch ``c``
    by the rule's keyed noise (its twin's ``draft_branches``). One branch drafts by the
    target's own noise G* in every such rule (gls's single column is G*), so it takes the
    support-restricted argmax of :func:`gumbel_draft`, without hashing all ``V`` tokens."""
    if q.shape[0] == 1:
        return gumbel_draft(q, seed, position).reshape(1)
    s, t = (torch.tensor([v], device=q.device) for v in (seed, position))
    return RULES[rule].torch.draft_branches(q.unsqueeze(0), s, t)[0]
