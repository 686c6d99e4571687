"""Speculative generation on real Hugging Face causal LMs, gpt-fast style.

One request (batch of one sequence); ``k`` draft branches run as a batch of ``k`` through the
draft, and through the target as one row with tree attention (or, for models that do not take a
custom attention mask, as a batch of ``k``). The pieces:

``prefill``      feed the prompt (all but its last token) into a KV cache
                 (:mod:`coupling.llm.cache`).
``propose``      the drafter's ``k`` branches of up to ``gamma`` tokens and their exact laws
                 ``q`` (:mod:`coupling.llm.drafters`).
:func:`verify`   one target call on ``[pending tokens, branch tokens]`` for all k branches,
                 giving ``p`` along every branch; the rule of :data:`coupling.rules.RULES`
                 decides accepted length, branch and next token
                 (:func:`coupling.llm.rules_adapter.decide`).
:func:`generate` the loop of :func:`step`; after each step both caches are rolled back to the
                 longest prefix that is still the committed text and the chosen branch is kept.

A run names its rule by its registry name with ``k`` and ``replacement`` (k i.i.d. branches,
or k distinct first tokens by successive sampling);
:func:`coupling.llm.rules_adapter.check_rule` refuses what the drafters cannot feed the rule,
and a lossy rule unless the run is labelled lossy.

Laws. ``q`` and ``p`` are produced by :func:`coupling.llm.sampling.probs` with the *same*
:class:`SamplingConfig` (temperature, top-k, top-p) in float32: ``q`` is the law drafts were
really sampled from, ``p`` the law plain sampling uses. A point-mass drafter (n-gram) has
``q = one_hot(token)``.

Randomness: drafts use a ``torch.Generator`` seeded with ``seed``; the rules draw their uniforms
keyed by ``(seed, absolute position)``. The autoregressive sampler with ``gumbel=True`` uses the
keyed Gumbel noise at ``(seed, position)`` so that, under one seed, ``gumbel`` verification and
plain sampling emit the same stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from coupling.dist import validate_count
from coupling.rules import RULES
from coupling.tree import Tree

from . import rules_adapter
from .cache import (
    TREE_ATTENTION,
    TREE_MODEL_TYPES,
    CachedLM,
    check_prompt,
    common_prefix,
    prefill,
    supports_tree,
    vocab_size,
)
from .drafters import (
    Drafter,
    ModelDrafter,
    NgramDrafter,
    NoDrafter,
    check_confidence,
    draft_block,
    draw_rows,
    sample_chain,
)
from .rules_adapter import MULTI_DRAFT_RULES
from .sampling import SamplingConfig, probs

__all__ = ["CachedLM", "Drafter", "GenerationResult", "ModelDrafter", "NgramDrafter",
           "NoDrafter", "StepRecord", "TREE_ATTENTION", "TREE_MODEL_TYPES", "autoregressive",
           "common_prefix", "draft_block", "draw_rows", "generate", "hf_assisted", "prefill",
           "sample_chain", "supports_tree", "verify"]


def _check_seed(seed: int) -> int:
    # keyed uniforms and torch tensors hold seeds as int64
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) \
            or not -2**63 <= seed < 2**63:
        raise ValueError(f"seed={seed!r} must be an integer in [-2**63, 2**63)")
    return int(seed)


@dataclass
class StepRecord:
    """One verification step: drafted length, accepted length, per-position laws' overlaps."""

    drafted: int
    accepted: int
    branch: int
    # alpha[i] = sum_x min(p_i, q_i) along the chosen branch, i = 1..drafted
    alpha: list[float] = field(default_factory=list)
    # rule-specific per-position acceptance (see coupling.llm.predict); filled when predicting
    beta: list[float] = field(default_factory=list)
    predicted: float = float("nan")      # predicted tokens for this call (coupling.llm.predict)
    conditional: float = float("nan")    # E[accepted + 1 | drafts] (token and block rules)
    # E[accepted + 1 | the same drafts] had block verification judged them (k = 1 rules):
    # pairs block with token on identical blocks, free of the runs' diverging trajectories
    block_on_drafts: float = float("nan")
    # multi-draft rules: the predicted tokens had the LP-optimal verifier judged the same
    # draft law (same k, same replacement) on these laws: what the rule leaves on the table
    optimal_predicted: float = float("nan")


@dataclass
class GenerationResult:
    tokens: list[int]                 # generated tokens (prompt excluded), EOS included if hit
    steps: list[StepRecord]
    target_calls: int
    draft_calls: int
    seconds: float
    target_seconds: float
    draft_seconds: float
    #: False when a lossy rule (``generate(lossy=True)``) made the tokens: not the target's law
    lossless: bool = True

    @property
    def block_efficiency(self) -> float:
        """Mean tokens emitted per target call (accepted + 1), untruncated."""
        return float(np.mean([s.accepted + 1 for s in self.steps])) if self.steps else 0.0

    @property
    def predicted_block_efficiency(self) -> float:
        """Mean over steps of the predicted tokens per call (see coupling.llm.predict)."""
        return float(np.mean([s.predicted for s in self.steps])) if self.steps else float("nan")

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafted tokens / drafted tokens."""
        drafted = sum(s.drafted for s in self.steps)
        return sum(s.accepted for s in self.steps) / drafted if drafted else float("nan")


def verify(target: CachedLM, seq: list[int], drafts: torch.Tensor, q: torch.Tensor, rule: str,
           cfg: SamplingConfig, seed: int, *, replacement: bool = True,
           tree: bool = False) -> tuple[int, int, list[int], torch.Tensor]:
    """One target call on all k branches; the backend rule decides. Returns
    (accepted length m, chosen branch c, emitted tokens (m drafted + 1), p [k, g+1, V]).

    k > 1 branches go through the target as one row with tree attention when ``tree``
    (:meth:`CachedLM.forward_tree`), else as a batch of k rows sharing a repeated KV cache.
    """
    k, g = drafts.shape
    feed = target.sync(seq)
    if k > 1 and tree:
        logits, rows = target.forward_tree(feed, drafts)      # [1 + k g, V], one row
        p = probs(logits, cfg)[rows]                          # [k, g+1, V]
    else:
        target.expand(k)
        ids = torch.cat([torch.tensor([feed], device=drafts.device).expand(k, -1), drafts], 1)
        logits = target.forward(ids)[:, len(feed) - 1:]       # [k, g+1, V], k rows
        p = probs(logits, cfg)
    position = len(seq)
    m, c, emitted = rules_adapter.decide(rule, drafts, q, p, seed, position,
                                         replacement=replacement)
    if k > 1 and tree:
        target.select_branch(c, keep=m)
    else:
        target.select(c)
    return m, c, emitted, p


@dataclass(frozen=True)
class Run:
    """What one :func:`generate` call fixes for all its steps."""

    rule: str
    k: int
    replacement: bool
    gamma: int
    cfg: SamplingConfig
    seed: int
    tree: bool
    confidence: float | None
    record_alpha: bool
    predict: bool
    #: a static draft tree of any shape, drafted and verified node by node (else k chains)
    topology: Tree | None = None


def check_run(target_model, drafter: Drafter | None, prompt: list[int], *, max_new_tokens: int,
              rule: str, gamma: int, k: int, seed: int, replacement: bool, lossy: bool,
              draft_confidence: float | None) -> tuple[list[int], int, int, int, int]:
    """Validated ``(prompt, max_new_tokens, gamma, k, seed)`` of a :func:`generate` call,
    checked before a passed-in cache is touched; ``ValueError`` naming the argument."""
    max_new_tokens = validate_count(max_new_tokens, "max_new_tokens")
    k = validate_count(k, "k")
    gamma = validate_count(gamma, "gamma", minimum=0)   # 0: plain sampling, the same loop
    seed = _check_seed(seed)
    check_confidence(draft_confidence)
    t_vocab = vocab_size(target_model)
    prompt = check_prompt(prompt, t_vocab)
    d_vocab = getattr(drafter, "vocab_size", None)
    if drafter is not None and d_vocab is not None and t_vocab is not None \
            and d_vocab != t_vocab:
        raise ValueError(f"the drafter's vocabulary has {d_vocab} tokens, the target's "
                         f"{t_vocab}: target and draft must share one tokenizer")
    rules_adapter.check_rule(rule, k, replacement, lossy=lossy)
    if rule == rules_adapter.PLAIN and drafter is not None and gamma > 0:
        raise ValueError(f"rule={rule!r} samples without drafts: pass gamma=0 or drafter=None, "
                         "or a rule of coupling.rules.RULES to verify the drafts")
    return prompt, max_new_tokens, gamma, k, seed


def check_tree(target_model, drafter: Drafter | None, rule: str, k: int, tree: Tree) -> None:
    """``generate(tree=)``'s conditions: a :class:`coupling.Tree` the rule verifies node by
    node (:func:`coupling.rules.topology.check_tree_rule`), a target that takes tree
    attention, a drafter that fills trees, and no ``k`` beside it."""
    from coupling.rules.topology import check_tree_rule

    if not isinstance(tree, Tree):
        raise TypeError(f"tree must be a coupling.Tree, got {type(tree).__name__}")
    if k != 1:
        raise ValueError(f"k={k} and tree= both shape the draft; give the branches in the tree "
                         "(Tree.from_chains(k, gamma)) and leave k=1")
    if rule == rules_adapter.PLAIN:
        raise ValueError("tree= drafts a tree for a rule to verify; rule='plain' verifies none")
    check_tree_rule(RULES[rule], tree)
    if not supports_tree(target_model):
        raise ValueError(f"tree= verifies the tree in one call with tree attention, which model "
                         f"type {getattr(target_model.config, 'model_type', None)!r} does not "
                         f"take (supports_tree: {TREE_MODEL_TYPES} with {TREE_ATTENTION})")
    if drafter is not None and not callable(getattr(drafter, "propose_tree", None)):
        raise ValueError(f"the {getattr(drafter, 'name', type(drafter).__name__)} drafter "
                         "proposes chains only; draft trees with a ModelDrafter")


def tree_layout(tlm: CachedLM, tree_attention: bool | None) -> bool:
    """Whether k > 1 branches go through the target as one row with tree attention."""
    if tree_attention is None:
        return supports_tree(tlm.model)
    if tree_attention and not supports_tree(tlm.model):
        raise ValueError(f"tree_attention=True, but model type "
                         f"{getattr(tlm.model.config, 'model_type', None)!r} is not one of "
                         f"{TREE_MODEL_TYPES} with attention {TREE_ATTENTION}; pass False")
    return bool(tree_attention)


def start(tlm: CachedLM, drafter: Drafter | None, prompt: list[int], *,
          reuse: bool) -> tuple[int, float]:
    """Prefill the target (and the drafter, bound to the target's hidden states if it reads
    them); return the drafter's (calls, seconds) counters before the run."""
    tlm.calls, tlm.seconds = 0, 0.0
    feats = drafter is not None and getattr(drafter, "needs_target_features", False)
    tlm.keep_features = feats
    prefill(tlm, prompt, reuse=reuse)
    if drafter is None:
        return 0, 0.0
    if feats:
        drafter.bind(tlm)
    drafter.reset(prompt)
    return getattr(drafter, "calls", 0), getattr(drafter, "seconds", 0.0)


def plain_step(tlm: CachedLM, seq: list[int], run: Run,
               gen: torch.Generator) -> tuple[list[int], StepRecord]:
    """Nothing drafted (an n-gram miss, no drafter): one target call, one token."""
    feed = tlm.sync(seq)
    tlm.expand(1)
    p = probs(tlm.forward(torch.tensor([feed], device=tlm.device))[:, -1], run.cfg)   # [1, V]
    tok = rules_adapter.sample_target(run.rule, p, run.seed, len(seq), gen)
    # exact conditionals exist for the rules with a path law (see coupling.llm.predict)
    exact = 1.0 if rules_adapter.has_path_law(run.rule) else float("nan")
    return [tok], StepRecord(0, 0, 0, predicted=1.0, conditional=exact, block_on_drafts=exact)


def analyse(rec: StepRecord, run: Run, drafts: torch.Tensor, q: torch.Tensor,
            p: torch.Tensor) -> None:
    """Fill the step's overlaps (``record_alpha``) and predictions (``predict``) from the laws
    it saw (:mod:`coupling.llm.predict`): analysis, not charged to generation."""
    c, g = rec.branch, rec.drafted
    if run.record_alpha:
        # overlaps along the chosen branch, positions 1..g (the bonus law has no draft)
        rec.alpha = torch.minimum(p[c, :g].double(), q[c].double()).sum(-1).tolist()
    if not run.predict:
        return
    from . import predict as P

    rec.beta = P.step_beta(run.rule, drafts, q, p, c, drafts.shape[0], run.replacement)
    rec.predicted = P.predicted_block_efficiency(run.rule, rec.beta)
    if run.rule in MULTI_DRAFT_RULES:
        rec.optimal_predicted = P.optimal_block_efficiency(run.rule, rec, drafts, q, p, c,
                                                           run.replacement)
    if rules_adapter.has_path_law(run.rule):
        rec.block_on_drafts = P.conditional("block", drafts, q, p, c)
        rec.conditional = P.conditional(run.rule, drafts, q, p, c)


def verify_topology(target: CachedLM, seq: list[int], tree: Tree, drafts: torch.Tensor,
                    q: torch.Tensor, rule: str, cfg: SamplingConfig,
                    seed: int) -> tuple[int, list[int], list[int], torch.Tensor]:
    """One target call on a drafted static tree (``drafts [N]`` in node order, ``q [N + 1,
    V]``), by tree attention; the rule walks it (:func:`rules_adapter.decide_tree`). Returns
    (accepted length m, the accepted nodes, the emitted tokens, ``p [N + 1, V]``)."""
    feed = target.sync(seq)
    logits = target.forward_nodes(feed, drafts.tolist(), list(tree.parent))
    p = probs(logits[len(feed) - 1:], cfg)                     # [N + 1, V]
    m, node, emitted = rules_adapter.decide_tree(rule, tree, drafts, q, p, seed, len(seq))
    path = tree.path_to(node)
    target.select_path(path)
    return m, path, emitted, p


def tree_step(tlm: CachedLM, drafter, seq: list[int], run: Run, gen: torch.Generator,
              on_step: Callable | None) -> tuple[list[int], StepRecord, float]:
    """:func:`step` on a static draft tree: draft it, verify it in one target call, and (with
    ``predict``) record the exact expected tokens given the drafted tree
    (:func:`coupling.sequence.predict.conditional_tree_tokens`, for a rule with ``try_law`` or
    ``topology_law``)."""
    tree = run.topology
    drafts, q = drafter.propose_tree(seq, tree, run.cfg, gen)
    m, path, emitted, p = verify_topology(tlm, seq, tree, drafts, q, run.rule, run.cfg,
                                          run.seed)
    drafter.accept_path(path)
    rec = StepRecord(tree.size, m, path[-1] if path else -1)
    t0 = time.perf_counter()
    rows = [0] + [1 + n for n in path if tree.kids[n]]          # judged laws along the path
    if run.record_alpha:
        rec.alpha = torch.minimum(p[rows].double(), q[rows].double()).sum(-1).tolist()
    from coupling.sequence.predict import conditional_tree_tokens, values_trees

    if run.predict and values_trees(run.rule):
        rec.predicted = rec.conditional = conditional_tree_tokens(
            run.rule, tree, drafts.cpu().numpy(), p.double().cpu().numpy(),
            q.double().cpu().numpy())
    spent = time.perf_counter() - t0
    if on_step is not None:
        on_step(rec, drafts, q, p)
    return emitted, rec, spent


def step(tlm: CachedLM, drafter: Drafter | None, seq: list[int], budget: int, run: Run,
         gen: torch.Generator, on_step: Callable | None) -> tuple[list[int], StepRecord, float]:
    """One step: draft up to ``min(gamma, budget)`` tokens, verify them in one target call (or
    sample one token if nothing was drafted). Returns the emitted tokens, the step's record
    and the seconds its analysis took."""
    if drafter is None or run.gamma == 0:
        return (*plain_step(tlm, seq, run, gen), 0.0)
    if run.topology is not None:
        return tree_step(tlm, drafter, seq, run, gen, on_step)
    noise = (run.rule, run.seed, len(seq)) if rules_adapter.shares_noise(run.rule) else None
    drafts, q = drafter.propose(seq, min(run.gamma, budget), run.k, run.cfg, gen,
                                distinct_first=rules_adapter.distinct_first(run.replacement,
                                                                            run.k),
                                noise=noise, confidence=run.confidence)
    if drafts.shape[1] == 0:
        return (*plain_step(tlm, seq, run, gen), 0.0)
    m, c, emitted, p = verify(tlm, seq, drafts, q, run.rule, run.cfg, run.seed,
                              replacement=run.replacement, tree=run.tree)
    drafter.accept(c)
    rec = StepRecord(int(drafts.shape[1]), m, c)
    t0 = time.perf_counter()
    analyse(rec, run, drafts, q, p)
    spent = time.perf_counter() - t0
    if on_step is not None:
        on_step(rec, drafts, q, p)
    return emitted, rec, spent


def generate(target_model, drafter: Drafter | None, prompt: list[int], *, max_new_tokens: int,
             rule: str = "token", gamma: int = 4, k: int = 1, cfg: SamplingConfig | None = None,
             seed: int = 0, eos_token_id: int | None = None, replacement: bool = True,
             target: CachedLM | None = None, record_alpha: bool = True,
             predict: bool = False, on_step=None,
             tree_attention: bool | None = None,
             draft_confidence: float | None = None, lossy: bool = False,
             tree: Tree | None = None) -> GenerationResult:
    """Speculative sampling of up to ``max_new_tokens`` tokens after ``prompt``.

    ``rule`` is a name of :data:`coupling.rules.RULES` verifying ``k`` branches drawn i.i.d.
    (``replacement=True``) or with k distinct first tokens (``False``), as the rule takes
    them; a lossy rule (``RULES[rule].lossless`` False) runs only with ``lossy=True``, and the
    result says so (``GenerationResult.lossless``). ``drafter=None`` or ``gamma=0`` gives
    plain autoregressive sampling through the same cache code (``rule="gumbel"`` then samples
    with the keyed Gumbel noise at (seed, position); ``rule="plain"`` by inverse CDF).
    ``on_step(record, drafts, q, p)`` is called after each verification (trace recording).
    ``tree_attention``: verify k > 1 branches as one row with tree attention (default: when
    :func:`supports_tree`), else as a batch of k rows.
    ``draft_confidence``: blocks of one token where the draft's first law peaks below it,
    of ``gamma`` elsewhere (:func:`sample_chain`; ``None``: always ``gamma``).
    ``target``: a :class:`CachedLM` of ``target_model`` to run in; it keeps the longest common
    prefix of its cache and the prompt (:func:`prefill` with ``reuse``), so many generations
    from one prompt pay its prefill once. Without it each call starts from an empty cache.
    ``tree``: a static draft tree of any shape (:class:`coupling.Tree`) instead of ``k``
    chains of ``gamma``: drafted level by level and verified in one target call by tree
    attention, node by node (:func:`check_tree`); a step emits at most ``tree.depth + 1``
    tokens.
    """
    prompt, max_new_tokens, gamma, k, seed = check_run(
        target_model, drafter, prompt, max_new_tokens=max_new_tokens, rule=rule, gamma=gamma,
        k=k, seed=seed, replacement=replacement, lossy=lossy, draft_confidence=draft_confidence)
    if tree is not None:
        check_tree(target_model, drafter, rule, k, tree)
    rules_adapter.prepare(rule)
    tlm = target or CachedLM(target_model)
    run = Run(rule, k, replacement, gamma, cfg or SamplingConfig(), seed,
              tree_layout(tlm, tree_attention), draft_confidence, record_alpha, predict, tree)
    drafter = drafter if gamma > 0 else None
    t0 = time.perf_counter()
    d_calls, d_sec = start(tlm, drafter, prompt, reuse=target is not None)
    gen = torch.Generator(device=tlm.device).manual_seed(seed)
    seq, steps, excluded = list(prompt), [], 0.0
    while len(seq) - len(prompt) < max_new_tokens:
        emitted, rec, spent = step(tlm, drafter, seq, max_new_tokens - (len(seq) - len(prompt)),
                                   run, gen, on_step)
        steps.append(rec)
        excluded += spent
        seq.extend(emitted)
        if eos_token_id is not None and eos_token_id in emitted:
            seq = seq[: len(seq) - len(emitted) + emitted.index(eos_token_id) + 1]
            break
    if drafter is not None:
        d_calls = getattr(drafter, "calls", 0) - d_calls
        d_sec = getattr(drafter, "seconds", 0.0) - d_sec
    return GenerationResult(seq[len(prompt):][:max_new_tokens], steps, tlm.calls, d_calls,
                            time.perf_counter() - t0 - excluded, tlm.seconds, d_sec,
                            rule == rules_adapter.PLAIN or RULES[rule].lossless)


def autoregressive(target_model, prompt: list[int], *, max_new_tokens: int,
                   cfg: SamplingConfig | None = None, seed: int = 0,
                   eos_token_id: int | None = None, gumbel: bool = False,
                   target: CachedLM | None = None) -> GenerationResult:
    """Plain sampling from the target, one target call per token (same cache code)."""
    return generate(target_model, None, prompt, max_new_tokens=max_new_tokens,
                    rule="gumbel" if gumbel else "plain", gamma=0, cfg=cfg, seed=seed,
                    eos_token_id=eos_token_id, target=target)


def hf_assisted(target_model, draft_model, prompt: list[int], *, max_new_tokens: int,
                cfg: SamplingConfig, gamma: int, seed: int = 0,
                eos_token_id: int | None = None,
                confidence: float | None = None) -> GenerationResult:
    """Hugging Face ``generate(assistant_model=draft, do_sample=True)`` with a constant
    ``num_assistant_tokens = gamma`` (the same draft, the same sampling settings).

    ``confidence``: Hugging Face's own gate on the draft length, its
    ``assistant_confidence_threshold`` (drafting stops after a token whose draft probability is
    below it; 0, no gate, when None): the baseline's counterpart of
    ``generate(draft_confidence=)``, which gates on the first law's peak instead."""
    from .sampling import hf_kwargs

    max_new_tokens = validate_count(max_new_tokens, "max_new_tokens")
    gamma = validate_count(gamma, "gamma")
    check_confidence(confidence, "confidence")
    prompt = check_prompt(prompt, vocab_size(target_model))
    gc = draft_model.generation_config
    gc.num_assistant_tokens = gamma
    gc.num_assistant_tokens_schedule = "constant"
    gc.assistant_confidence_threshold = 0.0 if confidence is None else float(confidence)
    torch.manual_seed(seed)
    ids = torch.tensor([prompt], device=next(target_model.parameters()).device)
    calls = [0]
    hook = target_model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    t0 = time.perf_counter()
    with torch.no_grad():
        out = target_model.generate(ids, attention_mask=torch.ones_like(ids),
                                    assistant_model=draft_model, max_new_tokens=max_new_tokens,
                                    min_new_tokens=0, eos_token_id=eos_token_id,
                                    pad_token_id=eos_token_id, **hf_kwargs(cfg))
    dt = time.perf_counter() - t0
    hook.remove()
    toks = out[0, len(prompt):].tolist()
    if eos_token_id is not None and eos_token_id in toks:
        toks = toks[: toks.index(eos_token_id) + 1]
    # HF folds the prompt into its first verification call: tokens per target forward call
    return GenerationResult(toks, [], calls[0], 0, dt, 0.0, 0.0)
