"""Command line: ``coupling analyze`` (exact analysis of a draft/target pair), plus the
commands other packages register under the entry-point group ``coupling.commands``.

Examples
--------
::

    coupling analyze --target 0.5,0.3,0.2 --draft 0.2,0.2,0.6
    coupling analyze --target 1/3,2/3 --draft 2/3,1/3 --gamma 2      # Sun et al.'s example
    coupling analyze --target 0.5,0.3,0.2 --draft 0.2,0.2,0.6 --drafts 3 --without-replacement

Lossy rules (``typical``, ``relaxed``) are listed with their exact distortion (the total
variation between their output law and the target) next to the acceptance it buys, and the
best acceptance any coupling reaches at that distortion (an LP).

A registered command is a function ``main(argv: list[str]) -> int`` named by an entry point
``name = "module:function"`` in the group ``coupling.commands``; ``coupling name ...`` calls
it with the remaining arguments, and ``coupling --help`` shows the function's ``help``
attribute or the ``HELP`` string of its module.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from fractions import Fraction
from importlib.metadata import entry_points
from typing import Any

import numpy as np

from .dist import check_pair, tv
from .flags import flag_words
from .lp.solve import COUPLING_SOLVERS, solve_coupling


def parse_distribution(text: str, *, name: str) -> np.ndarray:
    """Parse ``"0.5,0.3,0.2"`` or ``"1/3,2/3"`` into a float array (validated later)."""
    values = []
    for part in (s.strip() for s in text.split(",")):
        try:
            values.append(float(Fraction(part)) if "/" in part else float(part))
        except (ValueError, ZeroDivisionError) as exc:
            raise ValueError(
                f"--{name} must be comma-separated probabilities such as 0.5,0.3,0.2 or 1/3,2/3; "
                f"could not read {part!r}: {exc}"
            ) from None
    return np.asarray(values, dtype=np.float64)


def analyze(
    p: np.ndarray,
    q: np.ndarray,
    *,
    k: int = 1,
    replacement: bool = True,
    gamma: int | None = None,
    seed: int = 0,
    solvers: tuple[str, ...] = COUPLING_SOLVERS,
) -> dict[str, Any]:
    """Exact analysis of one (target, draft) pair; the CLI prints what this returns."""
    from .lp.solve import optimal_lossy_acceptance
    from .rules import RULES
    from .rules.optimal import optimal_acceptance

    p, q = check_pair(p, q, names=("target", "draft"))
    out: dict[str, Any] = {
        "target": p.tolist(),
        "draft": q.tolist(),
        "k": k,
        "replacement": replacement,
        "tv": tv(p, q),
        "lp": {},
        "rules": {},
    }
    import ot  # noqa: F401  (imported before timing: its import alone takes ~1 s)

    for solver in solvers:
        t0 = time.perf_counter()
        c = solve_coupling(p, q, k, replacement=replacement, solver=solver)
        out["lp"][solver] = {
            "acceptance": c.acceptance,
            "status": c.status,
            "seconds": time.perf_counter() - t0,
        }
    opt = optimal_acceptance(p, q, k, replacement=replacement)
    out["optimal_acceptance"] = opt
    out["skipped"] = {}
    for name, rule in RULES.items():
        if rule.unit != "token":
            out["skipped"][name] = "judges a whole block: see block efficiency (--gamma)"
            continue
        if not rule.supports(k, replacement):
            out["skipped"][name] = rule.support_text.replace("replacement=False",
                                                             "--without-replacement")
            continue
        acc = rule.acceptance(p, q, k, replacement=replacement)
        lo, hi = rule.bound(p, q, k, replacement=replacement)
        # a rule that drafts its own law (greedy) is measured against the LP of that law
        own = rule.optimum(p, q, k, replacement=replacement)
        out["rules"][name] = row = {
            "acceptance": acc,
            "optimum_of_its_draft_law": own,
            "ratio_to_optimum": acc / own if own > 0 else float("nan"),
            "bound_low": lo,
            "bound_high": hi,
            "bound": rule.bound_text,
            "lossless": rule.lossless,
            "distortion": rule.distortion(p, q, k, replacement=replacement),
        }
        if not rule.lossless:    # measured against the LP at its distortion, not the lossless LP
            row["optimum_at_distortion"] = optimal_lossy_acceptance(
                p, q, k, distortion=row["distortion"], replacement=replacement)
            best = row["optimum_at_distortion"]
            row["ratio_to_optimum"] = acc / best if best > 0 else float("nan")
    if gamma is not None:
        out["block"] = _block_analysis(p, q, gamma=gamma, seed=seed, k=k,
                                       replacement=replacement)
    return out


#: the most draft trees (``V**(gamma k)``) the block section enumerates
MAX_BLOCK_TREES = 100_000


def _block_rules(V: int, gamma: int, k: int, replacement: bool) -> tuple[list[str], dict]:
    """``(rules, skipped)``: the rules whose exact tree law is small enough to enumerate here,
    and why each other rule is left out."""
    from .rules import RULES

    if V ** (gamma * k) > MAX_BLOCK_TREES:
        why = (f"the exact law enumerates V**(gamma k) = {V}**{gamma * k} draft trees, above "
               f"{MAX_BLOCK_TREES}: lower --gamma or --drafts")
        return [], {name: why for name in RULES}
    skipped = {name: r.support_text for name, r in RULES.items() if not r.supports(k, replacement)}
    return [name for name in RULES if name not in skipped], skipped


def _block_analysis(p: np.ndarray, q: np.ndarray, *, gamma: int, seed: int, k: int = 1,
                    replacement: bool = True) -> dict[str, Any]:
    from .sequence import (
        TabularLM,
        block_efficiency,
        full_information_accepted,
        optimal_block_efficiency,
    )

    def const(dist: np.ndarray):
        return lambda context: dist

    V = p.size
    res: dict[str, Any] = {"gamma": gamma, "seed": seed, "k": k}
    names, res["skipped"] = _block_rules(V, gamma, k, replacement)
    res["context_free"] = {rule: block_efficiency(rule, const(p), const(q), gamma, k=k,
                                                  replacement=replacement) for rule in names}
    if k == 1 and V**gamma <= 4096:
        # transport over whole blocks: an upper bound no lossless verifier reaches in general
        res["context_free"]["transport_bound"] = optimal_block_efficiency(const(p), const(q), gamma)
    if k == 1 and V ** (2 * gamma + 1) * (gamma + 1) <= 200_000:
        # LP over every lossless verifier that knows both models completely
        res["context_free"]["optimal_lossless_verifier"] = 1 + full_information_accepted(
            const(p), const(q), gamma
        )
    target = TabularLM(V, order=1, seed=seed)
    draft = TabularLM(V, order=1, seed=seed + 1)
    res["toy_model"] = {
        "vocab_size": V,
        "order": 1,
        **{rule: block_efficiency(rule, target, draft, gamma, k=k, replacement=replacement)
           for rule in names},
    }
    return res


def _print_analysis(res: dict[str, Any]) -> None:
    k = res["k"]
    mode = "i.i.d." if res["replacement"] else "without replacement"
    print(f"target  = {np.round(res['target'], 6).tolist()}")
    print(f"draft   = {np.round(res['draft'], 6).tolist()}")
    print(f"drafts  = {k} ({mode})")
    print(f"TV(target, draft) = {res['tv']:.12f}    1 - TV = {1 - res['tv']:.12f}")
    print()
    print("LP optimum of the membership-cost coupling (the oracle)")
    for solver, r in res["lp"].items():
        print(
            f"  {solver:<6} {r['acceptance']:.12f}   {r['seconds'] * 1e3:8.1f} ms   {r['status']}"
        )
    print(f"  closed-form optimum (min-cut scan): {res['optimal_acceptance']:.12f}")
    print()
    print(f"{'rule':<16}{'acceptance':>16}{'/ its LP':>12}   bound   (its LP: the optimum of the "
          "rule's own draft law; a lossy rule's, at its distortion)")
    for name, r in res["rules"].items():
        print(
            f"{name:<16}{r['acceptance']:>16.12f}{r['ratio_to_optimum']:>12.6f}   "
            f"{r['bound']}  [{r['bound_low']:.6f}, {r['bound_high']:.6f}]"
        )
    _print_skipped(res["skipped"])
    lossy = {name: r for name, r in res["rules"].items() if not r["lossless"]}
    if lossy:
        print()
        print("LOSSY rules: their output is not the target's law")
        print(f"{'rule':<16}{'acceptance':>16}{'distortion':>16}{'best at it':>16}")
        for name, r in lossy.items():
            print(f"{name:<16}{r['acceptance']:>16.12f}{r['distortion']:>16.12f}"
                  f"{r['optimum_at_distortion']:>16.12f}")
        print("  distortion = TV(output law, target); best at it = the most any coupling "
              "accepts at that distortion (LP)")
    if "block" in res:
        b = res["block"]
        print()
        print(f"Block efficiency: expected tokens per target call, E[accepted] + 1 (papers that "
              f"count accepted tokens report 1 less), gamma = {b['gamma']}, k = {b['k']}")
        for label, d in (
            ("your laws at every position (context-free)", b["context_free"]),
            (f"a random context-dependent pair, not your laws (TabularLM V="
             f"{b['toy_model']['vocab_size']}, seeds {b['seed']} and {b['seed'] + 1})",
             b["toy_model"]),
        ):
            print(f"  {label}")
            for rule, value in d.items():
                if rule not in ("vocab_size", "order"):
                    lossy = "  (LOSSY)" if rule in res["rules"] and \
                        not res["rules"][rule]["lossless"] else ""
                    print(f"    {rule:<26}{value:.12f}{lossy}")
        _print_skipped(b["skipped"], indent="  ")


def _print_skipped(skipped: dict[str, str], indent: str = "") -> None:
    """The rules left out of a table, a line per reason."""
    for why in dict.fromkeys(skipped.values()):
        names = ", ".join(n for n, w in skipped.items() if w == why)
        print(f"{indent}skipped: {names} ({why})")


def _cmd_analyze(args: argparse.Namespace) -> int:
    p = parse_distribution(args.target, name="target")
    q = parse_distribution(args.draft, name="draft")
    res = analyze(
        p,
        q,
        k=args.drafts,
        replacement=not args.without_replacement,
        gamma=args.gamma,
        seed=args.seed,
    )
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        _print_analysis(res)
    return 0


def _commands() -> dict:
    """Subcommands registered by installed packages (entry-point group ``coupling.commands``)."""
    return {ep.name: ep for ep in entry_points(group="coupling.commands")}


ANALYZE_HELP = "exact analysis of a target/draft pair"


def analyze_arguments(a: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``coupling analyze`` on the parser ``a``."""
    a.add_argument(
        "--target", required=True, help="target probabilities, e.g. 0.5,0.3,0.2 or 1/3,2/3"
    )
    a.add_argument("--draft", required=True, help="draft probabilities over the same vocabulary")
    a.add_argument(
        "--drafts", type=int, default=1, metavar="K", help="number of drafts k (default 1)"
    )
    a.add_argument("--without-replacement", action="store_true", help="k distinct drafts")
    a.add_argument(
        "--gamma",
        type=int,
        default=None,
        help="also report block efficiency for blocks of G drafts",
    )
    a.add_argument("--seed", type=int, default=0, help="seed of the toy model used with --gamma")
    a.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return a


def _summary(ep) -> str:
    """A registered command's one-line help: its function's ``help`` attribute, else the
    ``HELP`` string of its module."""
    try:
        fn = ep.load()
        text = getattr(fn, "help", None) or getattr(sys.modules[fn.__module__], "HELP", "")
    except Exception:                     # a broken plug-in must not break `coupling --help`
        text = ""
    return f"{text} (`coupling {ep.name} --help`)" if text else f"`coupling {ep.name} --help`"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="coupling",
        description="Speculative decoding as distribution coupling and optimal transport.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    analyze_arguments(sub.add_parser("analyze", help=ANALYZE_HELP))
    for name, ep in sorted(_commands().items()):
        sub.add_parser(name, help=_summary(ep), add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = _commands()
    if argv and argv[0] in commands and argv[0] != "analyze":
        return int(commands[argv[0]].load()(argv[1:]) or 0)
    if argv and argv[0] == "analyze":     # its own usage line for its own mistakes
        args = analyze_arguments(argparse.ArgumentParser(
            prog="coupling analyze", description=ANALYZE_HELP)).parse_args(argv[1:])
    else:
        args = build_parser().parse_args(argv)
    from .lp.solvers import SolverError

    try:
        code = _cmd_analyze(args)
        sys.stdout.flush()            # a closed pipe fails here, where it is handled
        return code
    except BrokenPipeError:           # the reader left (`coupling analyze ... | head`)
        _silence_stdout()
        return 1
    except (ValueError, OverflowError) as exc:       # bad input
        print(f"coupling analyze: error: {flag_words(str(exc))}", file=sys.stderr)
        return 2
    except SolverError as exc:                        # an LP that could not be certified
        print(f"coupling analyze: solver error: {exc}", file=sys.stderr)
        return 3


def _silence_stdout() -> None:
    """Point standard output at the null device, so that the flush at exit finds no closed pipe
    (Python's documented answer to SIGPIPE)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):     # no file descriptor behind it
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
