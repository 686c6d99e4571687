r"""What the coupling analysis predicts for a run, from the (p, q) pairs actually seen.

Each verification step records, along the chosen branch, the target laws
:math:`p_1..p_{g+1}` and draft laws :math:`q_1..q_g` (at the drafted prefix). Two predictions
of the block efficiency (tokens per target call) are computed per step and averaged over steps:

``predicted`` (the table's column): per-position acceptance probabilities composed as if
positions were independent,

.. math:: \widehat{BE} = \sum_{j=0}^{g} \prod_{i=1}^{j} \beta_i
          \qquad (\text{the } j = 0 \text{ term is } 1),

with :math:`\beta_i` the rule's single-step acceptance probability on :math:`(p_i, q_i)`:

* ``token``: :math:`\beta_i = \alpha_i = \sum_x \min(p_i(x), q_i(x)) = 1 - TV(p_i, q_i)`, the
  maximal-coupling value (Leviathan et al.'s formula with position-wise alpha);
* ``block``: block verification has no position-wise acceptance; its prediction is Sun et al.'s
  identity :math:`P(\tau \ge i \mid X^i) = w_i` with
  :math:`w_i = \min(w_{i-1} p_i(X_i)/q_i(X_i), 1)`, i.e. :math:`\widehat{BE} = 1 + \sum_i w_i`
  (exact conditional expectation given the drafts; its average over steps is unbiased);
* ``kseq``, ``rrs``, ``optimal`` with ``k`` branches: :math:`\beta_i` is the rule's closed-form
  acceptance (``coupling.rules.<rule>.acceptance``; ``optimal``:
  ``coupling.optimal.optimal_acceptance``) with :math:`k_i` drafts, where :math:`k_i` is the
  number of branches that agree with the chosen branch on positions :math:`< i` (``k_1 = k``;
  branches that share a prefix have i.i.d. continuations). ``rrs`` and ``optimal`` without
  replacement (``rrs_wor``, ``optimal_wor``) use ``replacement=False`` at position 1 and single
  chains (``k_i = 1``) after it;
* ``gumbel``: :math:`\beta_i` is the exact Gumbel collision probability
  :math:`\sum_x 1/\sum_j \max(p_j/p_x, q_j/q_x)` (independent noise at each position).

``optimal_predicted`` (multi-draft rules, the table's "BE opt"): the same composition with
:math:`\beta_i` the LP optimum (:func:`coupling.optimal.optimal_acceptance`) for the rule's
own information model (the k branches' draft law, with or without replacement), on the laws
of the same steps: the block efficiency an optimal verifier would have predicted on them. It
bounds what kseq / rrs could gain from a better verifier, and it runs where the exact optimal
*sampler* cannot (k >= 3 on real supports needs an LP over U^k draft tuples).

``block_on_same_drafts`` (token and block runs, reported in JSON): block's exact conditional
:math:`1 + \sum_i w_i` evaluated on the very drafts the run verified. On a token run it pairs
the two rules on identical blocks. With :math:`r_i = p_i(X_i)/q_i(X_i)` and
:math:`t_j = \prod_{i \le j} \min(1, r_i)` (token's term), :math:`w_j \ge t_j` by induction:
:math:`w_j = \min(w_{j-1} r_j, 1) \ge \min(t_{j-1} r_j, t_{j-1}) = t_j` as
:math:`t_{j-1} \le \min(w_{j-1}, 1)`. So the paired difference is never negative; it
isolates the rule's effect from the diverging trajectories of two separate runs.

``conditional`` (token only, reported in JSON): the exact expected tokens given the drafts,
:math:`1 + \sum_{j=1}^{g} \prod_{i \le j} \min(1, p_i(X_i)/q_i(X_i))`; like block's, its
average over steps is an unbiased estimate of the measured block efficiency. The gap between
``predicted`` and ``conditional`` measures how much position-wise composition (which ignores
that the drafted token and the next position's overlap are correlated) is off on real text.

Closed forms run in numpy float64 on the union of the supports of :math:`p_i` and
:math:`q_i` (tokens outside both carry no mass and change none of these quantities).
"""

from __future__ import annotations

import importlib

import numpy as np
import torch


def compose(beta: list[float] | np.ndarray) -> float:
    """sum_{j=0}^{g} prod_{i<=j} beta_i (j = 0 term is 1)."""
    out, prod = 1.0, 1.0
    for b in beta:
        prod *= float(b)
        out += prod
    return out


def _check_rule(rule: str) -> None:
    from .rules_adapter import RULES

    if rule not in RULES:
        raise ValueError(f"rule={rule!r}: choose one of {', '.join(RULES)}")


def check_step(rule: str, drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
               branch: int) -> None:
    """Validate one step's record for the predictions below: ``rule`` an engine rule, drafts
    [k, g] integer ids in [0, V), q [k, g, V], p [k, g + 1, V], ``branch`` in [0, k), and the
    chosen branch's drafts possible under q (a draft with q = 0 was not sampled from q: its
    ratio p / q would be infinite). ``ValueError`` naming the argument otherwise."""
    from coupling.torch_backend._common import check_token_ids

    _check_rule(rule)
    if not isinstance(drafts, torch.Tensor) or drafts.dim() != 2:
        raise ValueError(f"drafts must be an integer tensor [k, g], got "
                         f"{tuple(getattr(drafts, 'shape', ()))}")
    check_token_ids(drafts)
    k, g = drafts.shape
    if q.dim() != 3 or q.shape[:2] != (k, g):
        raise ValueError(f"q must be [k, g, V] = [{k}, {g}, V] for drafts [{k}, {g}], got "
                         f"{tuple(q.shape)}")
    V = q.shape[2]
    if tuple(p.shape) != (k, g + 1, V):
        raise ValueError(f"p must be [k, g + 1, V] = [{k}, {g + 1}, {V}], got {tuple(p.shape)}")
    if isinstance(branch, bool) or not isinstance(branch, (int, np.integer)) \
            or not 0 <= branch < k:
        raise ValueError(f"branch={branch!r} must be an integer in [0, {k})")
    if drafts.numel() and (int(drafts.min()) < 0 or int(drafts.max()) >= V):
        raise ValueError(f"drafts must be token ids in [0, {V}), got values in "
                         f"[{int(drafts.min())}, {int(drafts.max())}]")
    if g and not bool((q[branch].gather(-1, drafts[branch, :, None].long()) > 0).all()):
        raise ValueError("q gives probability 0 to a draft of the chosen branch: the drafts "
                         "were not sampled from q (pass the law they were drawn from)")


def _support_pair(p: torch.Tensor, q: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    pd, qd = p.double(), q.double()
    keep = (pd > 0) | (qd > 0)
    pn, qn = pd[keep].numpy(), qd[keep].numpy()
    return pn / pn.sum(), qn / qn.sum()


def _acceptance_fn(name: str):
    if name == "optimal":
        from coupling.optimal import optimal_acceptance

        return optimal_acceptance
    return importlib.import_module(f"coupling.rules.{name}").acceptance


def step_beta(rule: str, drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor, branch: int,
              k: int, replacement: bool = True) -> list[float]:
    """Per-position acceptance beta_i along the chosen branch (see module docstring).

    drafts [k, g], q [k, g, V], p [k, g+1, V]; returns g floats. For ``block`` returns the
    block weights w_1..w_g (so that :func:`compose`-free ``1 + sum(w)`` is its prediction).
    """
    check_step(rule, drafts, q, p, branch)
    if k != drafts.shape[0]:
        raise ValueError(f"k={k!r} must equal the number of branches drafts holds, "
                         f"{drafts.shape[0]}")
    g = drafts.shape[1]
    c = branch
    if rule == "block":
        x = drafts[c]
        px = p[c, :g].double().gather(-1, x[:, None]).squeeze(-1)
        qx = q[c].double().gather(-1, x[:, None]).squeeze(-1)
        w, out = 1.0, []
        for r in (px / qx).tolist():
            w = min(w * r, 1.0)
            out.append(w)
        return out
    if rule == "token":
        return torch.minimum(p[c, :g].double(), q[c].double()).sum(-1).tolist()
    from .rules_adapter import backend_rule, distinct_first

    name = backend_rule(rule)[0]
    fn = _acceptance_fn(name)
    wor = distinct_first(rule, replacement)
    out = []
    for i in range(g):
        if wor:
            ki, repl = (k, False) if i == 0 else (1, True)
        elif k > 1:
            ki = int((drafts[:, :i] == drafts[c, :i]).all(-1).sum()) if i else k
            repl = True
        else:
            ki, repl = 1, True
        pn, qn = _support_pair(p[c, i], q[c, i])
        if ki == 1 and name in ("kseq", "rrs", "optimal"):
            out.append(float(np.minimum(pn, qn).sum()))  # every rule reduces to 1 - TV at k=1
        else:
            out.append(float(fn(pn, qn, ki, replacement=repl)))
    return out


def predicted_block_efficiency(rule: str, beta: list[float]) -> float:
    """The step's predicted tokens per target call from :func:`step_beta`'s output."""
    _check_rule(rule)
    if rule == "block":
        return 1.0 + float(sum(beta))
    return compose(beta)


def optimal_block_efficiency(rule: str, rec, drafts: torch.Tensor, q: torch.Tensor,
                             p: torch.Tensor, branch: int, replacement: bool = True) -> float:
    """:func:`predicted_block_efficiency` of the LP-optimal verifier on a multi-draft rule's
    step: the same drafts' laws and draft law (k, with or without replacement), each position
    judged by :func:`coupling.optimal.optimal_acceptance`. ``rec``: the step's record, whose
    ``predicted`` this is when the rule is itself ``optimal``."""
    from .rules_adapter import backend_rule, distinct_first

    _check_rule(rule)
    if backend_rule(rule)[0] == "optimal":
        check_step(rule, drafts, q, p, branch)      # else step_beta checks the step
        return rec.predicted
    opt = "optimal_wor" if distinct_first(rule, replacement) else "optimal"
    return compose(step_beta(opt, drafts, q, p, branch, drafts.shape[0]))


def conditional_block(drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor, branch: int) -> float:
    """E[accepted + 1 | drafts] for block verification on these drafts: 1 + sum_i w_i."""
    return 1.0 + float(sum(step_beta("block", drafts, q, p, branch, drafts.shape[0])))


def conditional_token(drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor, branch: int) -> float:
    """E[accepted + 1 | drafts] for token verification: 1 + sum_j prod_{i<=j} min(1, r_i)."""
    check_step("token", drafts, q, p, branch)
    g = drafts.shape[1]
    x = drafts[branch]
    px = p[branch, :g].double().gather(-1, x[:, None]).squeeze(-1)
    qx = q[branch].double().gather(-1, x[:, None]).squeeze(-1)
    return compose(torch.clamp(px / qx, max=1.0).tolist())
