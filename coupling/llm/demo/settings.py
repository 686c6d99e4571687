"""What ``coupling demo`` runs: its methods, prompts, command line and resolved settings."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

PROMPTS_FILE = Path(__file__).resolve().parent.parent.parent / "data" / "prompts.json"
#: the first-law peak above which the int8 target's demo drafts a second token (auto_settings)
INT8_DRAFT_CONFIDENCE = 0.8


@dataclass(frozen=True)
class Method:
    """One line of the demo: a baseline (``kind`` "ar" or "hf") or the engine running
    ``rule`` (a lossless rule of :data:`coupling.rules.RULES`) on ``k`` branches drawn
    i.i.d. or, with ``replacement=False``, with k distinct first tokens, from ``drafter``
    ("trained", "feature" or "ngram")."""

    kind: str          # "ar" | "hf" | "engine"
    rule: str = ""
    k: int = 1
    replacement: bool = True
    drafter: str = "trained"
    #: a static draft tree (``coupling.Tree.from_spec``: "3,2,1", "eagle:16", a .json of
    #: paths) instead of k chains of gamma
    tree: str = ""
    #: the tree's child law ("iid", or "distinct" for children without replacement)
    children: str = "iid"
    #: appended to the label (a plan's candidates: "_plan1", "_plan2", ...)
    tag: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("ar", "hf", "engine"):
            raise ValueError(f"kind={self.kind!r}: choose ar, hf or engine")
        if self.kind != "engine":
            return
        from coupling.rules import RULES

        if self.rule not in RULES or not RULES[self.rule].lossless:
            lossless = [n for n, r in RULES.items() if r.lossless]
            raise ValueError(f"rule={self.rule!r}: the demo compares lossless rules, one of "
                             f"{', '.join(lossless)}")
        if not RULES[self.rule].supports(self.k, self.replacement):
            raise ValueError(f"rule={self.rule!r} does not take k={self.k}, "
                             f"replacement={self.replacement}: {RULES[self.rule].support_text}")
        if self.drafter not in ("trained", "feature", "ngram"):
            raise ValueError(f"drafter={self.drafter!r}: choose trained, feature or ngram")
        if self.tree:
            from coupling.rules.topology import check_tree_rule

            check_tree_rule(RULES[self.rule], self.topology())

    def topology(self):
        """The method's :class:`coupling.Tree` (``None`` for k chains)."""
        from coupling.tree import Tree

        return Tree.from_spec(self.tree, self.children) if self.tree else None

    @property
    def label(self) -> str:
        """The name ``--methods`` takes and the results use: the rule, ``_k{k}`` for k > 1,
        ``_distinct`` for distinct first tokens, ``_{drafter}`` for a drafter other than the
        trained one (``rrs_k2_distinct_feature``)."""
        if self.kind != "engine":
            return {"ar": "autoregressive", "hf": "hf_assisted"}[self.kind]
        return (self.rule + (f"_k{self.k}" if self.k > 1 else "")
                + ("" if self.replacement else "_distinct")
                + ("" if self.drafter == "trained" else f"_{self.drafter}")
                + ("_tree" if self.tree else "") + self.tag)


FULL = [
    Method("ar"),
    Method("hf"),
    Method("engine", "token"),
    Method("engine", "block"),
    Method("engine", "kseq", 2),
    Method("engine", "kseq", 4),
    Method("engine", "rrs", 2),
    Method("engine", "rrs", 4),
    # the exact optimal sampler (the min-cut race for i.i.d. drafts)
    Method("engine", "optimal", 2),
    Method("engine", "optimal", 4),
    Method("engine", "is", 2),
    # drafter-invariant rules: one seed gives the same text whatever the drafter
    Method("engine", "gumbel"),
    Method("engine", "minhash"),
    Method("engine", "gls", 2),
    Method("engine", "strict", 2),
    Method("engine", "token", drafter="ngram"),
    # feature-level (EAGLE-style) draft: reads the target's hidden states, so HF assisted
    # generation cannot run it (coupling.llm.feature_draft)
    Method("engine", "token", drafter="feature"),
    Method("engine", "block", drafter="feature"),
    Method("engine", "rrs", 2, drafter="feature"),
    # two *distinct* first tokens (successive sampling), verified by rrs and by the exact
    # optimum for that draft law
    Method("engine", "rrs", 2, replacement=False, drafter="feature"),
    Method("engine", "optimal", 2, replacement=False, drafter="feature"),
    # draft trees of two paths: traversal verification and greedy multi-path block verification
    Method("engine", "traversal", 2, drafter="feature"),
    Method("engine", "gbv", 2, drafter="feature"),
    Method("engine", "gumbel", drafter="feature"),
]
QUICK = ["autoregressive", "hf_assisted", "token", "block", "kseq_k2", "gumbel",
         "block_feature"]


def tree_methods(args: argparse.Namespace) -> list[Method]:
    """The lines ``--tree`` adds: each rule of ``--tree-rule`` (comma-separated) on that tree
    (``ValueError`` naming the option when the tree is malformed or a rule cannot verify
    it)."""
    out = []
    for rule in [r.strip() for r in args.tree_rule.split(",") if r.strip()]:
        try:
            out.append(Method("engine", rule, tree=args.tree))
        except ValueError as exc:
            raise ValueError(f"--tree {args.tree} --tree-rule {rule}: {exc}") from None
    if not out:
        raise ValueError("--tree-rule: empty; name at least one rule")
    return out


def plan_methods(args: argparse.Namespace) -> list[Method]:
    """The lines ``--plan`` adds: its best ``--plan-top`` candidates as tree methods labelled
    ``<rule>_tree_plan<rank>``, each carrying its predicted tokens/s (``predicted``)."""
    try:
        data = json.loads(Path(args.plan).read_text())
        rows = data["candidates"][:args.plan_top]
        out = []
        for i, row in enumerate(rows, start=1):
            m = Method("engine", row["rule"], tree=json.dumps(row["tree"]),
                       children=row.get("children", "iid"), tag=f"_plan{i}")
            PREDICTED[m.label] = row.get("predicted_tokens_per_s")
            out.append(m)
        return out
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"--plan {args.plan}: not a `coupling plan --json` file ({exc})") \
            from None


#: a plan's predicted tokens/s per method label, filled by :func:`plan_methods`
PREDICTED: dict[str, float | None] = {}


def load_prompts() -> list[str]:
    return json.loads(PROMPTS_FILE.read_text())["prompts"]


def check_args(args: argparse.Namespace) -> None:
    """Refuse settings the run would otherwise replace or trip over late (after the models
    load, or after the whole run): ValueError naming the option."""
    n_file = len(load_prompts())
    counts = (("--prompts", args.prompts, 1, n_file), ("--max-new-tokens", args.max_new_tokens,
              1, None), ("--gamma", args.gamma, 1, None), ("--threads", args.threads, 1, None))
    for opt, value, low, high in counts:
        if value is not None and (value < low or (high is not None and value > high)):
            span = f"in [{low}, {high}]" if high is not None else f">= {low}"
            raise ValueError(f"{opt} {value}: must be {span}"
                             + (f" (the demo has {n_file} prompts)" if opt == "--prompts" else ""))
    if args.draft_confidence is not None and not 0.0 <= args.draft_confidence <= 1.0:
        raise ValueError(f"--draft-confidence {args.draft_confidence}: must lie in [0, 1]")
    if args.draft_head < 0:
        raise ValueError(f"--draft-head {args.draft_head}: must be >= 0 (0: the full head)")
    scale = args.draft_logit_scale
    if scale is not None and not 0.0 < scale < float("inf"):
        raise ValueError(f"--draft-logit-scale {scale}: must be a finite number > 0 (1 runs the "
                         "drafts uncalibrated; leave it out for their calibrated scales)")
    if not -2**63 <= args.seed < 2**63:
        raise ValueError(f"--seed {args.seed}: must fit in int64")
    if args.methods is not None and not [m for m in args.methods.split(",") if m.strip()]:
        raise ValueError("--methods: empty; name at least one method, or leave it out")
    if getattr(args, "tree", None) is not None:
        tree_methods(args)       # a bad tree or a rule that cannot verify it, named now
    if getattr(args, "plan", None) is not None:
        plan_methods(args)
    first = getattr(args, "first_prompt", 0)
    n = args.prompts if args.prompts is not None else (3 if args.quick else 8)
    if not 0 <= first or first + n > n_file:
        raise ValueError(f"--first-prompt {first}: the demo has {n_file} prompts and the run "
                         f"takes {n} from there; lower --first-prompt or --prompts")
    for opt, path in (("--json", args.json), ("--plot", args.plot)):
        if path is not None and Path(path).is_dir():
            raise ValueError(f"{opt} {path}: is a directory; give a file name")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="coupling demo",
        description="Speculative sampling on a real LLM, every verification rule side by side.")
    ap.add_argument("--quick", action="store_true", help="3 prompts, 48 tokens, 7 methods")
    ap.add_argument("--prompts", type=int, default=None, help="number of prompts (default 8)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default 96 (quick: 48)")
    ap.add_argument("--gamma", type=int, default=None,
                    help="drafted tokens per step (default 2; see auto_settings)")
    ap.add_argument("--draft-confidence", type=float, default=None,
                    help="draft gamma tokens only where the draft's first law peaks at this "
                         "or more, else one (engine.sample_chain; default with an unset "
                         f"--gamma: {INT8_DRAFT_CONFIDENCE} on the int8 target, else off)")
    ap.add_argument("--temperature", type=float, default=0.7)
    # top-k 50 bounds the support, which lets the exact LP-plan `optimal` sampler run (k = 2)
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--methods", type=str, default=None,
                    help="comma-separated subset of: " + ",".join(m.label for m in FULL))
    # drafts.DRAFT_HEAD_TOKENS (not imported here: the parser must not pull in torch)
    ap.add_argument("--draft-head", type=int, default=4096,
                    help="restrict the draft's LM head to its n most likely tokens (0: full head)")
    ap.add_argument("--draft-quant", choices=("int8", "none"), default="int8",
                    help="both drafts' own weights and head weight-only int8 (a draft step is "
                         "bound by reading its weights; the target always runs in --dtype)")
    ap.add_argument("--target-quant", choices=("none", "int8"), default="none",
                    help="int8: a weight-only int8 target (int8.quantize_target_int8), run by "
                         "every method alike; for CPUs without native bf16 products, where a "
                         "bf16 call on a few tokens costs up to twice a one-token call "
                         "(docs/llm-demo.md)")
    ap.add_argument("--draft-logit-scale", type=float, default=None,
                    help="multiply both drafts' logits by this before the sampling transforms "
                         "(default: the calibrated scale stored with each draft's weights, "
                         "scripts/calibrate_draft.py; 1 runs them uncalibrated)")
    ap.add_argument("--tree", type=str, default=None,
                    help="also run a static draft tree with tree attention: per-depth widths "
                         "(3,2,1), a named tree with its size (eagle:16, medusa:16, "
                         "specinfer:12) or a .json list of paths; i.i.d. children, verified by "
                         "--tree-rule (the line <rule>_tree)")
    ap.add_argument("--tree-rule", type=str, default="rrs",
                    help="the rules that verify --tree, comma-separated (default rrs; "
                         "rrs,kseq,optimal,traversal take i.i.d. children)")
    ap.add_argument("--plan", type=Path, default=None,
                    help="also run the best candidates of a `coupling plan --json` file (the "
                         "recommended first), each with its predicted tokens/s")
    ap.add_argument("--plan-top", type=int, default=3, help="candidates of --plan to run (3)")
    ap.add_argument("--first-prompt", type=int, default=0,
                    help="start at this prompt of the demo's file (hold out the prompts a "
                         "plan's traces were recorded on)")
    ap.add_argument("--multi-draft-layout", choices=("tree", "batch"), default="tree",
                    help="verify k > 1 branches as one row with tree attention (one call of "
                         "1 + k * gamma tokens) or as a batch of k rows over a repeated cache")
    ap.add_argument("--device", type=str, default="cpu")
    ap.add_argument("--dtype", type=str, default="bfloat16")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--json", type=Path, default=None, help="write results as JSON here")
    ap.add_argument("--plot", type=Path, default=None, help="write a PNG figure here")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def auto_settings(target_quant: str, gamma: int | None, draft_confidence: float | None = None
                  ) -> tuple[int, float | None, list[str]]:
    """Resolve an unset ``--gamma`` (and with it ``--draft-confidence``) for the target.

    Returns ``(gamma, draft_confidence, why)``, ``why`` one line per setting chosen here. An
    unset gamma is 2; on the int8 target it is gated at a first-law peak of
    :data:`INT8_DRAFT_CONFIDENCE` (``engine.sample_chain``'s ``confidence``): where an int8 call
    prices a second drafted token above what it adds on average, the gate drafts it only where
    the draft is sure of its first token (``python benchmarks/bench_gamma.py --target-quant
    int8 --gammas 1,2,2@0.8`` measures the three). Explicit values are kept; an explicit
    ``gamma`` is not gated unless asked.
    """
    why = []
    if gamma is None:
        gamma = 2
        if target_quant == "int8" and draft_confidence is None:
            draft_confidence = INT8_DRAFT_CONFIDENCE
            why.append(f"--gamma 2 --draft-confidence {draft_confidence:g}: on the int8 target "
                       "a second drafted token pays only where the draft's first law peaks "
                       f"at {draft_confidence:g} or more (benchmarks/bench_gamma.py)")
        else:
            why.append("--gamma 2")
    return gamma, draft_confidence, why


def resolve_auto(args: argparse.Namespace) -> argparse.Namespace:
    """Fill ``args.gamma`` and ``args.draft_confidence`` by :func:`auto_settings` (once); the
    lines saying why go to ``args.auto``. Returns ``args``."""
    if not hasattr(args, "auto"):
        args.gamma, args.draft_confidence, args.auto = auto_settings(
            args.target_quant, args.gamma, getattr(args, "draft_confidence", None))
    return args
