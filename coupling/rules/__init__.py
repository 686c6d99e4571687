"""The verification rules, one folder each, behind one registry.

``RULES`` maps a name to its :class:`~coupling.rules.base.Rule`: every layer of the package
(the exact analysis, :func:`coupling.check_rule`, the CLI, :func:`coupling.verify`) finds a
rule here and nowhere else. Variants are parameters (``k``, ``replacement``, and a rule's own:
the ``selection`` of ``is``, ``Typical(eps=...)``, ``Relaxed(topk=...)``,
``Optimal(sampler=...)``), not names.

=========  =============================================================  ==================
name       rule                                                           drafts
=========  =============================================================  ==================
token      speculative sampling (Leviathan et al. 2023; Chen et al. 2023)  k = 1
block      block verification (Sun et al. 2025)                           one block, k = 1
kseq       SpecTr k-sequential selection (Sun et al. 2023)                k >= 1, i.i.d.
rrs        recursive rejection sampling (SpecInfer; Yang; Jeon 2024)      k >= 1, both
optimal    LP-optimal verification (min cut; plan or race through it)    k >= 1, both
gumbel     shared-Gumbel drafter-invariant coupling (Daliri et al. 2024)  k = 1
minhash    weighted-MinHash drafter-invariant coupling (Daliri et al.)    k = 1
greedy     greedy drafts and their optimal verifier (Hu et al. 2025)      k >= 1, own law
is         importance-sampling selection (Khisti et al. 2025)             k >= 1, i.i.d.
spechub    a hub draft and one sample, staged plan (Sun et al. 2024)      k <= 2, own law
traversal  traversal verification of a draft tree (Weng et al. 2025)      k >= 1, both
gbv        greedy multi-path block verification (Thomas & Pal 2026)       k >= 1, i.i.d.
strict     exact match: the target's own sample among the drafts          k >= 1, both
gls        Gumbel-max list sampling, drafter-invariant (Rowan et al.)     k >= 1, i.i.d.
typical    Medusa typical acceptance (Cai et al. 2024): LOSSY             k >= 1, both
relaxed    top-k within a margin of the best (TensorRT-LLM): LOSSY        k >= 1, both
=========  =============================================================  ==================

``typical`` and ``relaxed`` are lossy (``rule.lossless`` is False): their output law is not
the target's, and they report it exactly (``rule.output_law``, ``rule.distortion``).

A rule's folder holds its math (module docstring), closed-form acceptance, exact law,
deterministic numpy core with explicit uniforms, sampler, bound and batched torch twin
(``torch.py``). ``NEGATIVE_CONTROLS`` holds deliberately broken rules that the harnesses
must flag.
"""

from __future__ import annotations

import difflib

from ..tree import Tree
from .base import Rule
from .block import PLAIN_RESIDUAL
from .block import RULE as BLOCK
from .gbv import RULE as GBV
from .gbv import GBVControl
from .gls import RULE as GLS
from .greedy import RULE as GREEDY
from .gumbel import EMIT_DRAFT
from .gumbel import RULE as GUMBEL
from .importance import RULE as IMPORTANCE
from .kseq import RULE as KSEQ
from .minhash import RULE as MINHASH
from .optimal import RULE as OPTIMAL
from .relaxed import RULE as RELAXED
from .rrs import RULE as RRS
from .spechub import RULE as SPECHUB
from .strict import RULE as STRICT
from .token import NO_RESIDUAL
from .token import RULE as TOKEN
from .topology import check_twin_topology
from .traversal import RULE as TRAVERSAL
from .traversal import TraversalControl
from .typical import RULE as TYPICAL


class Registry(dict):
    """``name -> rule``; an unknown name is a ``KeyError`` that lists the names and suggests
    the closest (``RULES["Block"]``: did you mean ``'block'``?)."""

    def __missing__(self, key):
        raise KeyError(unknown_rule(key, self))


def unknown_rule(name, names) -> str:
    """``unknown rule 'rss'; did you mean 'rrs'? known rules: ...``."""
    close = difflib.get_close_matches(str(name).lower(), list(names), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown rule {name!r}{hint}; known rules: {', '.join(names)}"


RULES: dict[str, Rule] = Registry((r.name, r) for r in (
    TOKEN, BLOCK, KSEQ, RRS, OPTIMAL, GUMBEL, MINHASH, GREEDY, IMPORTANCE, SPECHUB, STRICT, GLS,
    TRAVERSAL, GBV, TYPICAL, RELAXED))
#: deliberately broken rules, for the harnesses' negative controls (the tree rules' subtler
#: controls, lossy only on dedicated instances, live in their tests)
NEGATIVE_CONTROLS: dict[str, Rule] = {r.name: r for r in (
    NO_RESIDUAL, PLAIN_RESIDUAL, EMIT_DRAFT, TraversalControl("plain_residual"),
    TraversalControl("sibling_weight"), GBVControl("unskewed"))}


def get_rule(rule: str | Rule, *, controls: bool = False) -> Rule:
    """The rule named ``rule`` (or ``rule`` itself), else ``ValueError`` listing the names;
    ``controls`` also admits the negative controls."""
    if isinstance(rule, Rule):
        return rule
    if isinstance(rule, str) and rule in RULES:
        return RULES[rule]
    if controls and isinstance(rule, str) and rule in NEGATIVE_CONTROLS:
        return NEGATIVE_CONTROLS[rule]
    raise ValueError(unknown_rule(rule, RULES))


def verifiers() -> tuple[str, ...]:
    """The names of the rules with a batched torch twin (every rule of the registry)."""
    return tuple(name for name, rule in RULES.items() if rule.twin)


def verify(rule: str | Rule, drafts, p, q, *, tree: Tree | None = None, **kwargs):
    """Verify ``B`` requests' draft trees with ``rule``'s batched torch twin.

    ``drafts [B, k, gamma]``, ``p [B, k, gamma + 1, V]``, ``q [B, k, gamma, V]``
    (:mod:`coupling.torch_backend` has the glossary); or, with ``tree=`` a
    :class:`coupling.Tree` of ``N`` nodes, ``drafts [B, N]`` in node order and ``p``, ``q``
    ``[B, N + 1, V]`` (row 0 the root's laws, row ``1 + n`` those after node ``n``;
    :mod:`coupling.rules.topology`), verified node by node by the rule's kernel. ``rule`` is a
    name of :data:`RULES` or a rule (``ValueError`` naming the known rules otherwise);
    ``kwargs`` are the twin's (``seeds``, ``positions``, ``replacement``, ``validate``, ...).
    Torch is imported with the twin, on first use.

    >>> import torch, coupling
    >>> p = torch.tensor([[[[0.5, 0.5], [0.5, 0.5]]]])       # [B=1, k=1, gamma+1=2, V=2]
    >>> q = torch.tensor([[[[0.5, 0.5]]]])                   # [1, 1, gamma=1, V=2]
    >>> v = coupling.verify("block", torch.tensor([[[1]]]), p, q, seeds=0, positions=0)
    >>> int(v.accepted[0])                                   # p == q: always accepted
    1
    >>> tree = coupling.Tree.from_branching([2, 1])          # 4 nodes: two chains of two
    >>> v = coupling.verify("rrs", torch.tensor([[0, 1, 1, 0]]), torch.full((1, 5, 2), 0.5),
    ...                     torch.full((1, 5, 2), 0.5), tree=tree, seeds=0, positions=0)
    >>> int(v.accepted[0])                                   # p == q: a whole path accepted
    2
    """
    r = get_rule(rule)
    if tree is None:
        return r.torch.verify(drafts, p, q, **kwargs)
    check_twin_topology(r, tree)
    # the walk on a topology is torch code: imported with the twin, so the core needs no torch
    from ..torch_backend.topology import verify_topology

    if "replacement" in kwargs:
        raise ValueError("tree= says how the children were drafted (Tree.children); leave "
                         "replacement out")
    if r.unit != "token":                   # a tree of chains, judged as a whole
        return _verify_chains(r, tree, drafts, p, q, **kwargs)
    return verify_topology(r.torch.make_step, tree, drafts, p, q,
                           draws_by_position=r.draws_by_position, **kwargs)


def _verify_chains(r: Rule, tree: Tree, drafts, p, q, **kwargs):
    """A tree of ``k`` chains of ``gamma`` in node order (node ``j + i k`` is branch ``j``'s
    token at offset ``i``) handed to the chain twin in its layout; ``Verdict.branch`` is then
    the deepest accepted node, as on any topology."""
    import torch

    k, g, replacement = tree.chains()
    B = drafts.shape[0]
    if drafts.shape != (B, tree.size) or p.shape[:2] != (B, tree.size + 1) \
            or q.shape != p.shape:
        raise ValueError(f"a {tree.size}-node tree takes drafts [B, N] and p, q [B, N + 1, V]; "
                         f"got {tuple(drafts.shape)}, {tuple(p.shape)}, {tuple(q.shape)}")
    after = torch.arange(tree.size, device=drafts.device).view(g, k).T + 1   # [k, g] rows
    rows = torch.cat([torch.zeros(k, 1, dtype=torch.long, device=drafts.device), after], 1)
    v = r.torch.verify(drafts.view(B, g, k).transpose(1, 2), p[:, rows], q[:, rows[:, :g]],
                       replacement=replacement, **kwargs)
    node = torch.where(v.accepted > 0, v.branch + (v.accepted - 1) * k, -1)
    return v._replace(branch=node)


__all__ = ["RULES", "NEGATIVE_CONTROLS", "Rule", "get_rule", "unknown_rule", "verify",
           "verifiers"]
