"""The engine's only door to the rules: :mod:`coupling.torch_backend` (batched torch twins).

``decide`` hands one request's block (``B = 1``, ``k`` branches) to
``coupling.torch_backend.verify(rule, drafts, p, q, seeds=, positions=)``; nothing here
re-implements a rule. ``sample_target`` is the plain sampler used when no draft is proposed
(and by the autoregressive baseline): inverse CDF with the backend's keyed uniform
``U(seed, t, STREAM_SAMPLE, 0)``, or, for ``gumbel``, ``argmax(log p + G(seed, t))`` with the
backend's keyed Gumbel noise, so that under one seed plain sampling and gumbel verification emit
the same stream whatever the drafter (drafter invariance).
"""

from __future__ import annotations

import numpy as np
import torch

PLAIN = "plain"


#: engine rule names that verify one draft chain (k = 1) and those that verify k branches
SINGLE_DRAFT_RULES = ("token", "block", "gumbel")
MULTI_DRAFT_RULES = ("kseq", "rrs", "rrs_wor", "optimal", "optimal_wor")
#: every rule name the engine takes
RULES = SINGLE_DRAFT_RULES[:2] + MULTI_DRAFT_RULES + SINGLE_DRAFT_RULES[2:]
#: engine rule names whose k branches start with k *distinct* tokens (successive sampling from
#: q_1), and the backend verifier that checks them with ``replacement=False``
WITHOUT_REPLACEMENT = {"rrs_wor": "rrs", "optimal_wor": "optimal"}
#: backend verifiers defined for both draft laws (the others take i.i.d. branches only)
_TAKES_REPLACEMENT = ("rrs", "optimal")


def backend_rule(rule: str, replacement: bool = True) -> tuple[str, bool]:
    """(backend verifier, replacement) of an engine rule: ``rrs_wor`` and ``optimal_wor`` are
    ``rrs`` / ``optimal`` with ``replacement=False``; other names pass ``replacement`` on."""
    if rule in WITHOUT_REPLACEMENT:
        return WITHOUT_REPLACEMENT[rule], False
    return rule, replacement


def distinct_first(rule: str, replacement: bool = True) -> bool:
    """Whether the drafter must draw the k first tokens without replacement for this rule."""
    name, repl = backend_rule(rule, replacement)
    return name in _TAKES_REPLACEMENT and not repl


def available() -> dict[str, str | None]:
    """rule name -> None if the backend provides it, else the reason it cannot run."""
    try:
        from coupling import torch_backend as tb
    except Exception as exc:  # pragma: no cover - backend broken
        return {r: f"coupling.torch_backend failed to import: {exc}" for r in RULES}
    out: dict[str, str | None] = {}
    for r in RULES:
        name = backend_rule(r)[0]
        out[r] = None if name in tb.VERIFIERS else (
            f"coupling.torch_backend has no verifier {name!r} yet (has {sorted(tb.VERIFIERS)})")
    return out


def check_available(rule: str) -> None:
    if rule == PLAIN:
        return
    reason = available().get(rule, f"unknown rule {rule!r}")
    if reason is not None:
        raise ValueError(reason)


def prepare(rule: str) -> None:
    """Import what a rule's rare paths need, before a run times anything: the optimal rules
    solve a part of their plan by POT's LP where its closed form fails (about 1 call in 100
    on the demo's laws), and importing POT then would cost 0.4 s in the middle of a run."""
    if rule != PLAIN and backend_rule(rule)[0] == "optimal":
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
    are those on the full vocabulary (``tests/test_llm.py`` checks it rule by rule).
    ``gumbel``, the one rule keyed by token ids, gets the keyed noise of the kept tokens
    (``gumbel_noise(tokens=)``: the very entries of the full vectors). On a CPU the rules'
    passes over V then cost next to nothing, and gumbel skips hashing V entries per position.
    """
    from coupling import torch_backend as tb
    from coupling.torch_backend._common import check_token_ids, numpy_readable

    # what compression would blur: the ids' type and the shared vocabulary (the backend
    # checks every other shape, on the compressed laws)
    check_token_ids(drafts)
    if p.shape[-1] != q.shape[-1]:
        raise ValueError(f"p and q must share one vocabulary (their last axis): p has "
                         f"{p.shape[-1]} entries, q {q.shape[-1]}")
    name, repl = backend_rule(rule, replacement)
    kwargs = {}
    if name in _TAKES_REPLACEMENT:
        kwargs["replacement"] = repl
    idx = None
    if compress:
        V = p.shape[-1]
        idx, ok = checked_support(p, q)
        if not ok:   # a NaN, inf or negative entry: the backend's checks name it on full laws
            compress, idx = False, None
    if compress:
        # full-V laws, above as_numpy's size bound: only whether numpy can read them in place
        if numpy_readable(p) and numpy_readable(q) and drafts.device.type == "cpu":
            ids, d = idx.numpy(), drafts.numpy()
            x_np = np.minimum(np.searchsorted(ids, d), max(ids.size - 1, 0))
            if ids.size == 0 or not np.array_equal(ids[x_np], d):
                raise ValueError(_OFF_SUPPORT)
            drafts = torch.from_numpy(x_np)
            p = torch.from_numpy(p.detach().numpy()[..., ids])
            q = torch.from_numpy(q.detach().numpy()[..., ids])
        else:
            x = torch.searchsorted(idx, drafts).clamp_(max=max(idx.numel() - 1, 0))
            if idx.numel() == 0 or not torch.equal(idx[x], drafts):
                raise ValueError(_OFF_SUPPORT)
            drafts, p, q = x, p[..., idx], q[..., idx]
        if name == "gumbel":
            g = drafts.shape[1]
            kwargs["noise"] = tb.gumbel_noise(
                torch.tensor(seed, device=p.device),
                position + torch.arange(g + 1, device=p.device), V, tokens=idx,
                dtype=torch.float64, device=p.device)[None]                    # [1, g+1, U]
    verdict = tb.verify(name, drafts[None], p[None], q[None],
                        seeds=torch.tensor([seed], device=drafts.device),
                        positions=torch.tensor([position], device=drafts.device), **kwargs)
    m = int(verdict.accepted[0])
    c = int(verdict.branch[0])
    toks = verdict.tokens[0, : m + 1]
    if idx is not None and idx.device.type == "cpu":
        return m, c, idx.numpy()[toks.numpy()].tolist()
    return m, c, (toks if idx is None else idx[toks]).tolist()


def _gumbel_argmax(law: torch.Tensor, seed: int, position: int, name: str) -> torch.Tensor:
    """argmax_v log law[r, v] + G(seed, position, v) per row r of law [rows, V] (float64).

    Only tokens of positive mass can win, so the noise is hashed on the support alone
    (``gumbel_noise(tokens=)``); the winner is the full-vocabulary argmax, bit for bit.
    """
    from coupling.torch_backend import gumbel_noise
    from coupling.torch_backend._common import check_probs

    check_probs(law, name)      # else a NaN or negative entry would simply never win
    idx = support(law)
    g = gumbel_noise(torch.tensor(seed, device=law.device),
                     torch.tensor(position, device=law.device), law.shape[-1], tokens=idx,
                     dtype=torch.float64, device=law.device)                    # [U]
    return idx[torch.argmax(law[:, idx].double().log() + g, -1)]


def sample_target(rule: str, p: torch.Tensor, seed: int, position: int,
                  gen: torch.Generator | None = None) -> int:
    """Plain sample from p [1, V] keyed by (seed, position) (see module docstring).

    p is checked first (finite, non-negative, rows summing to 1), as the rules check theirs:
    the inverse-CDF draw would turn a NaN law into some token without a word."""
    from coupling.torch_backend import uniforms
    from coupling.torch_backend._common import check_probs
    from coupling.torch_backend.rng import STREAM_SAMPLE

    from .sampling import sample_rows

    if rule == "gumbel":
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
