"""The validated parameters of one :func:`coupling.hf.generate` call: rule, draft tree, seeds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .. import keyed
from ..dist import validate_count, validate_replacement
from ..keyed import MAX_DRAFTS
from ..rules import RULES, unknown_rule
from ..rules.topology import check_twin_topology
from ..torch_backend import check_inputs
from ..tree import Tree

__all__ = ["Options", "check_options", "row_seeds", "GREEDY_RULES", "SEED_STREAM"]

#: the rules that remain meaningful when ``do_sample=False`` (``rule.greedy_ok``)
GREEDY_RULES = tuple(name for name, rule in RULES.items() if rule.greedy_ok)

#: the stream id under which an integer seed is turned into one seed per row (a stream the
#: verifiers and drafters never use, so a row seed is no uniform of the run)
SEED_STREAM = 1 << 20


@dataclass(frozen=True)
class Options:
    """``rule`` verifies ``num_drafts`` branches of ``gamma`` drafted tokens each; branches are
    i.i.d. (``replacement=True``) or have distinct first tokens; ``do_sample=False`` verifies
    greedy laws. Or it verifies a static ``tree`` node by node."""

    rule: str
    num_drafts: int
    gamma: int
    replacement: bool
    do_sample: bool
    #: a static draft tree that is no tree of chains (``gamma`` is then its depth); ``None``
    #: for ``num_drafts`` chains of ``gamma``
    tree: Tree | None = None


def _support_text(rule: str, k: int, replacement: bool) -> str | None:
    """Why ``rule`` cannot verify ``k`` branches (``None`` when it can)."""
    spec = RULES[rule]
    return None if spec.supports(k, replacement) else spec.support_text


def check_options(rule: str, num_drafts: int, gamma: int, replacement: bool,
                  do_sample: bool, tree: Tree | None = None) -> Options:
    """Validate the method's parameters (``ValueError`` naming the argument and the fix).

    A ``tree`` of chains (``Tree.from_chains(k, gamma)``) becomes ``num_drafts=k``,
    ``gamma``, ``replacement``: the chain loop, bit for bit."""
    if not isinstance(rule, str) or rule not in RULES:
        raise ValueError(f"rule=: {unknown_rule(rule, RULES)}")
    if not RULES[rule].lossless:
        raise ValueError(f"rule={rule!r} is not a lossless verification rule; choose one of "
                         f"{sorted(n for n, r in RULES.items() if r.lossless)}")
    if tree is not None:
        if not isinstance(tree, Tree):
            raise TypeError(f"tree must be a coupling.Tree, got {type(tree).__name__}")
        if num_drafts != 1:
            raise ValueError(f"num_drafts={num_drafts} and tree= both shape the draft; give the "
                             "branches in the tree (Tree.from_chains(k, gamma)) and leave "
                             "num_drafts out")
        check_twin_topology(RULES[rule], tree)
        chains = tree.chains()
        if chains is not None:
            return check_options(rule, chains[0], chains[1], chains[2], do_sample)
        if not do_sample and not RULES[rule].greedy_ok:
            raise ValueError(f"rule={rule!r} couples sampled drafts, but do_sample=False asks "
                             "for greedy decoding; pass do_sample=True")
        tree_layout_limits(tree)
        return Options(rule, 1, tree.depth, tree.children != "distinct", bool(do_sample), tree)
    k = validate_count(num_drafts, "num_drafts", "(draft branches per step)")
    g = validate_count(gamma, "gamma", "(drafted tokens per branch and step)")
    replacement = validate_replacement(replacement)
    why = _support_text(rule, k, replacement)
    if why is not None:
        raise ValueError(f"rule={rule!r} cannot verify num_drafts={k} with "
                         f"replacement={replacement}: {why}")
    # the backend's own limits on the draft tree (MAX_DRAFTS), checked before any model call
    check_inputs(torch.zeros(1, k, g, dtype=torch.int64), torch.ones(1, k, g + 1, 1),
                 torch.ones(1, k, g, 1), 0, 0, validate=False, rule=rule)
    if not do_sample and not RULES[rule].greedy_ok:
        raise ValueError(
            f"rule={rule!r} couples sampled drafts, but do_sample=False asks for greedy "
            f"decoding; pass do_sample=True, or rule={' / '.join(map(repr, GREEDY_RULES))} "
            "for greedy verification")
    return Options(rule, k, g, replacement, bool(do_sample))


def tree_layout_limits(tree: Tree) -> None:
    """The keyed numbers' limit on a tree (``MAX_DRAFTS`` nodes at one depth), checked before
    any model call."""
    if max(tree.columns) >= MAX_DRAFTS:
        raise ValueError(f"tree= has {max(tree.columns) + 1} nodes at one depth; the keyed coins "
                         f"take at most {MAX_DRAFTS}")


def row_seeds(seed: int | Sequence[int] | torch.Tensor | None, batch_size: int) -> torch.Tensor:
    """One int64 seed per row: every random choice of row ``b`` is keyed by ``seeds[b]``.

    ``seed`` is ``None`` (seeds drawn from torch's global generator, so ``torch.manual_seed``
    reproduces a run as it does plain sampling), an int (row ``b`` gets the hash of
    ``(seed, b)``: rows are independent, and a row's result does not depend on the rows after
    it), or one non-negative int per row (row ``b`` of a batch then generates exactly what
    a batch of that row alone generates with ``seed=[seeds[b]]``).
    """
    if seed is None:
        return torch.randint(0, 2**62, (batch_size,), dtype=torch.int64)
    if isinstance(seed, bool):
        raise ValueError(f"seed must be an int, one int per row, or None; got {seed!r}")
    if isinstance(seed, int):
        if not 0 <= seed < 2**63:
            raise ValueError(f"seed={seed} must lie in [0, 2**63)")
        rows = torch.arange(batch_size, dtype=torch.int64)
        h = keyed.keyed_hash(torch.tensor(seed), rows, SEED_STREAM, 0, keyed.torch_backend())
        return h.bitwise_and(2**63 - 1)
    t = torch.as_tensor(seed)
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.shape != (batch_size,):
        raise ValueError(f"seed must be an int, one int per row (shape [{batch_size}]), or None; "
                         f"got {seed!r}")
    if bool((t < 0).any()):
        raise ValueError("seeds must be non-negative")
    return t.to(torch.int64).cpu()
