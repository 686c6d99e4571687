"""The decoding loop that ``model.generate(custom_generate=coupling.hf.generate)`` runs."""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.generation.utils import GenerationMixin

from ..rules import verify
from ..tree import Tree
from .drafting import Leaves, draft_topology, draft_tree
from .options import Options, check_options, row_seeds
from .output import SpeculativeDecoderOnlyOutput, Stats
from .processors import Laws
from .ragged import RaggedCache, check_cache
from .vocab import Retokenizer, check_proposal, check_tokenizers, retokenized_chain

__all__ = ["generate"]

#: model inputs the loop understands; ``generate`` adds the last four itself
_MODEL_INPUTS = ("attention_mask", "position_ids", "cache", "past_key_values", "use_cache",
                 "logits_to_keep")


def generate(model, input_ids: torch.LongTensor, logits_processor=None, stopping_criteria=None,
             generation_config=None, synced_gpus: bool = False, streamer=None,
             assistant_model=None, *, rule: str = "block", num_drafts: int = 1, gamma: int = 4,
             replacement: bool = True, seed: int | Sequence[int] | torch.Tensor | None = None,
             tree: Tree | None = None, tokenizers: tuple | None = None,
             proposal: str = "intersection", **model_kwargs):
    """Speculative decoding with a verification rule of :mod:`coupling`, inside ``generate``.

    Called by ``model.generate(input_ids, assistant_model=draft,
    custom_generate=coupling.hf.generate, do_sample=True, ..., rule=, num_drafts=, gamma=,
    replacement=, seed=)`` after ``generate`` has prepared the inputs, the cache, the logits
    processors and the stopping criteria. The output has the law of plain
    ``generate(do_sample=True)`` with the same arguments (module :mod:`coupling.hf`).

    Parameters
    ----------
    rule : a lossless rule of ``coupling.RULES``
        (``sorted(n for n, r in coupling.RULES.items() if r.lossless)``).
    num_drafts : draft branches per step (``k``); multi-draft rules only.
    gamma : tokens drafted per branch and step.
    replacement : i.i.d. branches (True) or distinct first tokens (False: successive draws, or
        the rule's own draft law, e.g. ``greedy``, ``spechub``).
    seed : ``None``, an int, or one int per row (:func:`coupling.hf.row_seeds`).
    tree : a static draft tree of any shape (:class:`coupling.Tree`) instead of
        ``num_drafts`` chains of ``gamma``, for a rule that verifies it node by node
        (``rrs``, ``kseq``, ``optimal``, ``token`` on chains, ``strict`` on top-k children,
        ...: :func:`coupling.rules.topology.check_tree_rule`). Each step drafts it level by
        level (:func:`.drafting.draft_topology`) and scores it in one target call, one model
        row per root-to-leaf path.
    tokenizers : ``(tokenizer, assistant_tokenizer)`` for an assistant with another tokenizer,
        one chain per row, drafting as ``proposal`` says (:mod:`.vocab`).
        transformers hands a ``custom_generate`` callable neither ``tokenizer=`` nor
        ``assistant_tokenizer=``, so they travel together under this name (the Hub folder
        ``custom_generate/`` also takes transformers' two names).
    proposal : how such an assistant proposes target tokens: ``"intersection"`` (the shared
        pieces, TLI) or ``"retokenized"`` (its own tokens, re-encoded; SLEM with ``strict``)
        (:mod:`.vocab`).
    """
    if generation_config is None or logits_processor is None or stopping_criteria is None:
        raise TypeError("coupling.hf.generate is a decoding method: call it as "
                        "model.generate(..., custom_generate=coupling.hf.generate)")
    found = _generate_call_arguments()
    draft = assistant_model if assistant_model is not None else found.get("assistant_model")
    streamer = streamer if streamer is not None else found.get("streamer")
    opts = check_options(rule, num_drafts, gamma, replacement, generation_config.do_sample, tree)
    check_proposal(proposal, tokenizers is not None)
    if tokenizers is not None:
        tokenizers = check_tokenizers(tokenizers)
        if opts.num_drafts != 1 or opts.tree is not None:
            raise ValueError("an assistant with another tokenizer drafts one chain per row: "
                             "pass num_drafts=1 and no tree= with tokenizers=")
    mask = _check_call(model, draft, input_ids, generation_config, model_kwargs, streamer,
                       synced_gpus, tokenizers is not None)
    cache = check_cache(model_kwargs.get("cache", model_kwargs.get("past_key_values")), "target")
    laws = Laws(logits_processor, input_ids.shape[0], greedy=not opts.do_sample)
    run = _Run(model, draft, cache, input_ids, mask, laws,
               stopping_criteria, generation_config, opts, row_seeds(seed, input_ids.shape[0]),
               streamer, tokenizers, proposal)
    while run.rows.numel():
        run.step()
    return run.output(input_ids)


def _generate_call_arguments() -> dict:
    """``assistant_model`` and ``streamer`` of the ``GenerationMixin.generate`` call that runs
    this decoding method.

    Why: ``generate`` (transformers 5.x, ``_extract_generation_mode_kwargs``) hands a
    ``custom_generate`` callable only the keyword arguments its signature adds to ``_sample``'s
    and that arrived in ``**kwargs``; ``assistant_model`` and ``streamer`` are named
    parameters of ``generate`` and are dropped, so they are read from its frame. Where a
    release passes them, the parameters of :func:`generate` receive them and this is unused.
    """
    code = inspect.unwrap(GenerationMixin.generate).__code__
    frame = inspect.currentframe()
    try:
        caller = frame.f_back if frame is not None else None
        for _ in range(4):  # this helper <- generate <- GenerationMixin.generate
            if caller is None:
                break
            if caller.f_code is code:
                names = caller.f_locals
                return {k: names.get(k) for k in ("assistant_model", "streamer")}
            caller = caller.f_back
        return {}
    finally:
        del frame


def _check_call(model, draft, input_ids, config, model_kwargs, streamer,
                synced_gpus, cross_vocab: bool) -> torch.Tensor:
    """Refuse what the loop cannot run exactly; return the prompt's attention mask."""
    if draft is None:
        raise ValueError("coupling.hf.generate verifies a draft model's tokens: pass "
                         "assistant_model=draft to generate")
    if model.config.is_encoder_decoder or draft.config.is_encoder_decoder:
        raise ValueError("coupling.hf.generate supports decoder-only models")
    vt, vd = (m.config.get_text_config().vocab_size for m in (model, draft))
    if vt != vd and not cross_vocab:
        raise ValueError(f"the draft's vocabulary has {vd} tokens and the target's {vt}: pass "
                         "tokenizers=(tokenizer, assistant_tokenizer) to draft the pieces the "
                         "two share, or use a draft with the target's tokenizer")
    if draft.device != model.device:
        raise ValueError(f"the draft is on {draft.device} and the target on {model.device}; "
                         "put both on one device")
    if synced_gpus:
        raise ValueError("coupling.hf.generate does not support synced_gpus")
    if config.num_beams != 1:
        raise ValueError(f"num_beams={config.num_beams}: coupling.hf.generate samples (or "
                         "decodes greedily) one sequence per row; use num_beams=1")
    if config.output_attentions or config.output_hidden_states:
        raise ValueError("coupling.hf.generate does not return attentions or hidden states; "
                         "pass output_attentions=False, output_hidden_states=False")
    B = input_ids.shape[0]
    if streamer is not None and B > 1:
        raise ValueError(f"a streamer receives one sequence, but the batch has {B} rows that "
                         "advance by different numbers of tokens; stream with batch size 1")
    extra = sorted(k for k, v in model_kwargs.items() if k not in _MODEL_INPUTS and v is not None)
    if extra:
        raise ValueError(f"coupling.hf.generate takes text inputs only; unsupported model "
                         f"inputs: {extra}")
    mask = model_kwargs.get("attention_mask")
    if mask is None:
        return torch.ones_like(input_ids)
    mask = mask.to(torch.long)
    # masked columns are holes, as left padding is (plain generate masks them alike); the last
    # token of a row starts its first step, so it must be a token of the row
    if bool((mask[:, -1] == 0).any()):
        raise ValueError("the last prompt token of a row is masked (right padding): tokenize "
                         "with padding_side='left'")
    return mask


class _Run:
    """The state of one batch: active rows, their sequences, both caches, the statistics.

    Active row ``a`` is row ``rows[a]`` of the input; model row ``a * k + j`` is its branch
    ``j``. ``seq[a, :cur[a]]`` is the row as plain ``generate`` holds it (left padding
    included), ``real[a]`` the number of its real tokens, which is the absolute position of
    its next token (the key of its randomness, and the verifier's ``positions``).
    """

    def __init__(self, model, draft, cache, input_ids, mask, laws: Laws, criteria, config,
                 opts: Options, seeds: torch.Tensor, streamer, tokenizers=None,
                 proposal: str = "intersection") -> None:
        B, P = input_ids.shape
        dev = input_ids.device
        self.leaves = Leaves.of(opts.tree, dev) if opts.tree is not None else None
        # model rows per input row: one per chain, or one per root-to-leaf path of the tree
        k = self.leaves.rows if self.leaves is not None else opts.num_drafts
        g = opts.gamma
        self.width = k
        self.laws, self.criteria, self.config, self.opts = laws, criteria, config, opts
        self.seeds, self.streamer = seeds.to(dev), streamer
        self.limit = config.max_length
        self.rule_kwargs = {} if opts.tree is not None else {"replacement": opts.replacement}
        self.seq = torch.zeros(B, max(self.limit, P + 1) + g + 1, dtype=torch.long, device=dev)
        self.seq[:, :P] = input_ids
        self.cur = torch.full((B,), P, dtype=torch.long, device=dev)
        self.real = mask.sum(1)
        self.rows = torch.arange(B, device=dev)
        self.out: list[list[int]] = [[] for _ in range(B)]
        self.kept_scores: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(B)]
        self.stats = Stats(B, g, opts.tree.size if opts.tree is not None else g * k)
        draft_cache = check_cache(DynamicCache(config=draft.config.get_text_config(decoder=True)),
                                  "draft")
        self.target = RaggedCache(model, cache, B, dev)
        self.draft = RaggedCache(draft, draft_cache, B, dev)
        self.retok = None if tokenizers is None else Retokenizer(
            tokenizers, model.config.get_text_config().vocab_size,
            draft.config.get_text_config().vocab_size,
            [ids[m > 0].tolist() for ids, m in zip(input_ids, mask, strict=True)], dev, proposal)
        for c in (self.target, self.draft):   # a sliding layer is exact within its window
            if c.window is not None and self.limit + g + 1 >= c.window:
                raise ValueError(f"max_length={self.limit} and gamma={g} reach past the "
                                 f"{c.window}-token sliding window of {type(c.model).__name__}'s "
                                 "layers; coupling.hf.generate is exact within it: lower "
                                 "max_new_tokens")
        if P > 1:  # the last prompt token is fed with the first drafts
            for c in (self.target,) if self.retok else (self.target, self.draft):
                c.forward(input_ids[:, :-1], mask[:, :-1], last_only=True)
        if k > 1:
            rep = torch.arange(B, device=dev).repeat_interleave(k)
            self.target.select(rep)
            self.draft.select(rep)
        last = input_ids[:, -1:].repeat_interleave(k, 0)
        self.feed = (last, torch.ones_like(last))

    def step(self) -> None:
        """Draft, verify, emit and stop, for every active row."""
        k, g = self.width, self.opts.gamma
        A = self.rows.numel()
        cur = self.cur.repeat_interleave(k)
        ext = self.seq.repeat_interleave(k, 0)  # each branch's sequence; drafts go after it
        batch_rows = self.rows.repeat_interleave(k)
        args = (self.draft, self.laws, self.opts, self.feed, ext, cur, batch_rows, self.seeds,
                self.real)
        if self.retok is not None:
            drafts, q = self._cross_vocab_chain(args)
            real = None
        elif self.leaves is None:
            tree = draft_tree(*args)
            drafts, q = tree.drafts, tree.q
            real = None
        else:
            drafts, q = draft_topology(*args)
            real = (torch.arange(g + 1, device=cur.device).unsqueeze(0)
                    <= self.leaves.length.repeat(A).unsqueeze(1)).to(torch.long)
        cols = cur.unsqueeze(1) - 1 + torch.arange(g + 1, device=cur.device)  # last token, drafts
        tokens = ext.gather(1, cols)
        raw = self.target.forward(tokens, torch.ones_like(tokens) if real is None else real)
        V = raw.shape[-1]                                            # raw [A*k, g+1, V]
        if V != q.shape[-1]:
            raise ValueError(f"the target's logits have {V} entries and the draft's "
                             f"{q.shape[-1]}: the models must share one vocabulary")
        scores, p = self.laws(ext.repeat_interleave(g + 1, 0), (cols + 1).reshape(-1),
                              batch_rows.repeat_interleave(g + 1), raw.reshape(-1, V))
        p = p.view(A, k, g + 1, V)
        if self.leaves is None:
            verdict = verify(self.opts.rule, drafts, p, q, seeds=self.seeds,
                             positions=self.real, **self.rule_kwargs)
            n, branch = verdict.accepted, verdict.branch
            last = drafts[torch.arange(A, device=n.device), branch, g - 1]
        else:   # node n's laws are those of the first leaf row through it, at its depth
            verdict = verify(self.opts.rule, drafts, p[:, self.leaves.row, self.leaves.offset],
                             q, tree=self.opts.tree, seeds=self.seeds, positions=self.real)
            n, node = verdict.accepted, verdict.branch
            branch = self.leaves.row[node + 1]
            last = drafts.gather(1, node.clamp(min=0).unsqueeze(1)).squeeze(1)
        self.stats.record(self.rows.cpu(), n)
        chosen = torch.arange(A, device=n.device) * k + branch
        if k > 1:  # every branch's cache continues from the emitted one
            follow = chosen.repeat_interleave(k)
            self.target.select(follow)
            self.draft.select(follow)
        self.target.keep(g + 1, (n + 1).repeat_interleave(k))
        if self.retok is None:     # else the next sync drops what the new context does not hold
            self.draft.keep(g - 1, n.clamp(max=g - 1).repeat_interleave(k))
        emitted = self._emit(verdict.tokens, n + 1, scores.view(A * k, g + 1, V)[chosen],
                             raw[chosen])
        self._next_feed(last, verdict.next_token, n)
        self._retire(emitted)

    def _cross_vocab_chain(self, args: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """Drafts and their laws from an assistant with another tokenizer (:mod:`.vocab`),
        after its cache is synced to each row's re-encoded text."""
        retok, g = self.retok, self.opts.gamma
        feed = retok.sync(self.draft)
        if retok.proposal == "retokenized":
            drafts, q = retokenized_chain(self.draft, retok, feed, g, self.seeds, self.real,
                                          self.config.temperature, self.opts.do_sample)
            ext, cur = args[4], args[5]         # the drafts follow each row's sequence
            ext.scatter_(1, cur.unsqueeze(1) + torch.arange(g, device=cur.device), drafts[:, 0])
            return drafts, q
        tree = draft_tree(*args[:3], feed, *args[4:], vocab=retok)
        retok.drafted(retok.draft_ids(tree.drafts[:, 0, :g - 1]))   # all fed but the last
        return tree.drafts, tree.q

    def _emit(self, tokens: torch.Tensor, count: torch.Tensor, scores: torch.Tensor,
              raw: torch.Tensor) -> torch.Tensor:
        """Append each row's tokens up to its first stop; return whether each row stopped."""
        A, g1 = tokens.shape
        j = torch.arange(g1, device=tokens.device).unsqueeze(0)
        valid = j < count.unsqueeze(1)
        cols = self.cur.unsqueeze(1) + j
        at = torch.arange(A, device=tokens.device).unsqueeze(1).expand(A, g1)
        self.seq[at[valid], cols[valid]] = tokens[valid]
        stop = _first_stops(self.criteria, self.seq, self.cur, count, scores, self.limit)
        kept = torch.where(stop >= 0, stop + 1, count)
        keep_scores = self.config.output_scores or self.config.output_logits
        emitted = [tokens[a, :m].tolist() for a, m in enumerate(kept.tolist())]
        if self.retok is not None:
            self.retok.emitted(emitted)
        for a, (row, m) in enumerate(zip(self.rows.tolist(), kept.tolist(), strict=True)):
            self.out[row].extend(emitted[a])
            if keep_scores:  # copies: a view would keep the step's rejected positions alive
                self.kept_scores[row].extend(zip(scores[a, :m].clone(), raw[a, :m].clone(),
                                                 strict=True))
        if self.streamer is not None:
            self.streamer.put(tokens[0, : int(kept[0])].cpu())
        self.cur = self.cur + count
        self.real = self.real + count
        return stop >= 0

    def _next_feed(self, last: torch.Tensor, z: torch.Tensor, n: torch.Tensor) -> None:
        """What the draft cache lacks: the emitted token, after the last draft if all were
        accepted (``last [A]``, the deepest accepted draft: it was never fed); elsewhere a
        masked column keeps the batch square."""
        k, g = self.width, self.opts.gamma
        full = n == g
        if bool(full.any()):
            last = torch.where(full, last, 0)
            tokens = torch.stack([last, z], 1)
            real = torch.stack([full.to(torch.long), torch.ones_like(z)], 1)
        else:
            tokens, real = z.unsqueeze(1), torch.ones_like(z).unsqueeze(1)
        self.feed = (tokens.repeat_interleave(k, 0), real.repeat_interleave(k, 0))

    def _retire(self, stopped: torch.Tensor) -> None:
        """Drop the rows that stopped from every per-row tensor and both caches."""
        if not bool(stopped.any()):
            return
        k = self.width
        alive = torch.nonzero(~stopped).squeeze(1)
        model_rows = (alive.unsqueeze(1) * k + torch.arange(k, device=alive.device)).reshape(-1)
        for name in ("rows", "seq", "cur", "real", "seeds"):
            setattr(self, name, getattr(self, name)[alive])
        self.feed = tuple(t[model_rows] for t in self.feed)
        if self.retok is not None:
            self.retok.select(alive.tolist())
        if alive.numel():
            self.target.select(model_rows)
            self.draft.select(model_rows)

    def output(self, input_ids: torch.Tensor):
        """``sequences`` (rows that stopped early padded), or the output dataclass."""
        if self.streamer is not None:
            self.streamer.end()
        B = len(self.out)
        width = max(len(o) for o in self.out)
        pad = _pad_token(self.config, any(len(o) < width for o in self.out))
        gen = torch.full((B, width), pad, dtype=torch.long, device=input_ids.device)
        for b, toks in enumerate(self.out):
            gen[b, : len(toks)] = torch.tensor(toks, dtype=torch.long)
        sequences = torch.cat([input_ids, gen], dim=1)
        if not self.config.return_dict_in_generate:
            return sequences
        return SpeculativeDecoderOnlyOutput(
            sequences=sequences,
            scores=self._per_token(0, width) if self.config.output_scores else None,
            logits=self._per_token(1, width) if self.config.output_logits else None,
            **self.stats.fields())

    def _per_token(self, which: int, width: int) -> tuple[torch.Tensor, ...]:
        """Generated token ``t`` -> ``[B, V]`` (zeros for rows that stopped before ``t``)."""
        any_row = next(s for s in self.kept_scores if s)
        V = any_row[0][which].shape[-1]
        out = []
        for t in range(width):
            step = torch.zeros(len(self.kept_scores), V, dtype=torch.float32)
            for b, s in enumerate(self.kept_scores):
                if t < len(s):
                    step[b] = s[t][which]
            out.append(step)
        return tuple(out)


def _pad_token(config, needed: bool) -> int:
    """The pad id of the output (``pad_token_id``, else the first EOS id)."""
    pad = config.pad_token_id
    if pad is None and config.eos_token_id is not None:
        eos = config.eos_token_id
        pad = eos[0] if isinstance(eos, (list, tuple)) else eos
    if pad is None:
        if needed:
            raise ValueError("rows stopped at different lengths but neither pad_token_id nor "
                             "eos_token_id is set; pass pad_token_id to generate")
        return 0
    return int(pad)


def _first_stops(criteria, seq: torch.Tensor, cur: torch.Tensor, count: torch.Tensor,
                 scores: torch.Tensor, limit: int) -> torch.Tensor:
    """Per row, the index (in this step) of the first new token after which the stopping
    criteria hold, or -1.

    Plain ``generate`` checks its criteria after every token; a step emits several, so each is
    checked on the sequence that ends with it (rows grouped by length; ``limit`` is
    ``max_length``, also checked here so the loop ends whatever the criteria).
    """
    A = cur.numel()
    stop = torch.full((A,), -1, dtype=torch.long, device=cur.device)
    for j in range(int(count.max())):
        live = (count > j) & (stop < 0)
        if not bool(live.any()):
            break
        lengths = cur + j + 1
        for length in torch.unique(lengths[live]).tolist():
            rows = torch.nonzero(live & (lengths == length)).squeeze(1)
            done = criteria(seq[rows, :length], scores[rows, j])
            done = torch.as_tensor(done, device=cur.device).expand(rows.numel())
            if length >= limit:
                done = torch.ones_like(done)
            stop[rows[done]] = j
    return stop
