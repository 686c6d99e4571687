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

import torch

PLAIN = "plain"


def available() -> dict[str, str | None]:
    """rule name -> None if the backend provides it, else the reason it cannot run."""
    try:
        from coupling import torch_backend as tb
    except Exception as exc:  # pragma: no cover - backend broken
        return {r: f"coupling.torch_backend failed to import: {exc}" for r in
                ("token", "block", "kseq", "rrs", "rrs_wor", "optimal", "gumbel")}
    out: dict[str, str | None] = {}
    for r in ("token", "block", "kseq", "rrs", "rrs_wor", "optimal", "gumbel"):
        name = "rrs" if r == "rrs_wor" else r
        out[r] = None if name in tb.VERIFIERS else (
            f"coupling.torch_backend has no verifier {name!r} yet (has {sorted(tb.VERIFIERS)})")
    return out


def check_available(rule: str) -> None:
    if rule == PLAIN:
        return
    reason = available().get(rule, f"unknown rule {rule!r}")
    if reason is not None:
        raise ValueError(reason)


def decide(rule: str, drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor, seed: int,
           position: int, *, replacement: bool = True) -> tuple[int, int, list[int]]:
    """Verify one request's k branches.

    drafts int64 [k, g], q float32 [k, g, V], p float32 [k, g+1, V];
    returns (accepted m, chosen branch c, emitted tokens = m drafted tokens + next token).
    """
    from coupling import torch_backend as tb

    name = "rrs" if rule == "rrs_wor" else rule
    kwargs = {}
    if name == "rrs":
        kwargs["replacement"] = replacement and rule != "rrs_wor"
    verdict = tb.verify(name, drafts[None], p[None], q[None],
                        seeds=torch.tensor([seed], device=drafts.device),
                        positions=torch.tensor([position], device=drafts.device), **kwargs)
    m = int(verdict.accepted[0])
    c = int(verdict.branch[0])
    toks = verdict.tokens[0, : m + 1].tolist()
    return m, c, toks


def sample_target(rule: str, p: torch.Tensor, seed: int, position: int,
                  gen: torch.Generator | None = None) -> int:
    """Plain sample from p [1, V] keyed by (seed, position) (see module docstring)."""
    from coupling.torch_backend import gumbel_noise, sample_rows, uniforms
    from coupling.torch_backend.rng import STREAM_SAMPLE

    seeds = torch.tensor([seed], device=p.device)
    pos = torch.tensor([position], device=p.device)
    if rule == "gumbel":
        g = gumbel_noise(seeds, pos, p.shape[-1], dtype=torch.float64, device=p.device)  # [1, V]
        return int(torch.argmax(p.double().log() + g, -1)[0])
    u = uniforms(seeds, pos, 1, stream=STREAM_SAMPLE, device=p.device)[:, 0]
    return int(sample_rows(p, u)[0])


def gumbel_draft(q: torch.Tensor, seed: int, position: int) -> torch.Tensor:
    """Drafter side of the Gumbel coupling: argmax(log q + G(seed, position)) per row of q."""
    from coupling import torch_backend as tb

    rows = q.shape[0]
    if hasattr(tb, "gumbel_draft"):
        return tb.gumbel_draft(q, torch.full((rows,), seed, device=q.device),
                               torch.full((rows,), position, device=q.device)).long()
    g = tb.gumbel_noise(torch.full((rows,), seed, device=q.device),
                        torch.full((rows,), position, device=q.device), q.shape[-1],
                        dtype=torch.float64, device=q.device)
    return torch.argmax(q.double().log() + g, -1)
