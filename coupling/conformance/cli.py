"""``coupling conformance MODULE:NAME``: run :func:`check_verifier` from the command line.

Examples
--------
::

    coupling conformance coupling.conformance.bugs:VLLM_SHARED_NOISE
    coupling conformance coupling.conformance.bugs:ASCEND_BLOCK_VERIFY --exact
    coupling conformance mypkg.verify:verify --gamma 3 --drafts 2 --draws 50000 --json
    coupling conformance mypkg.engine:batched_verify --torch
    coupling conformance mypkg.engine:padded_verify --torch --ragged --greedy --dtype bfloat16

``NAME`` is the verifier: a callable ``verify(drafts, p, q, rng)``; ``--torch`` wraps a
batched ``fn(drafts, p, q, generator)`` with :func:`coupling.conformance.from_torch`
(``--ragged``: it also takes ``num_drafts``; ``--greedy``: ``greedy`` rows ride along). The
exit status is 0 when the check passes, 1 when it finds a loss or the verifier raises on valid
input (a failure too: its traceback is printed with the pair and drafts it was given), 2 on bad
input to the command. A FAIL also prints the smallest failing case (``--no-minimize``: not):
the vocabulary, draft length and model pair, the strings that are off, and a script.
``MODULE`` is imported as ``python -m`` would, the current directory first.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback

from ..flags import flag_words

__all__ = ["add_parser", "add_arguments", "run", "load", "main", "HELP", "DESCRIPTION"]


HELP = "check that a verifier reproduces the target's law over whole sequences"
DESCRIPTION = ("Run whole generation loops of a verifier on context-dependent model pairs and "
               "test the law of the first tokens against the target's exact law.")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``conformance`` subcommand on ``subparsers`` (from ``add_subparsers``)."""
    return add_arguments(subparsers.add_parser("conformance", help=HELP,
                                               description=DESCRIPTION))


def add_arguments(a: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``coupling conformance`` on the parser ``a``."""
    a.add_argument("target", metavar="MODULE:NAME", help="the verifier, e.g. mypkg.spec:verify")
    a.add_argument("--vocab-size", type=int, default=3, metavar="V", help="vocabulary (3)")
    a.add_argument("--gamma", type=_gammas, default=None, metavar="G[,G...]",
                   help="drafts per branch; a list draws each step's from it (1,2,3,4)")
    a.add_argument("--drafts", "--k", dest="k", type=int, default=1, metavar="K",
                   help="draft branches, as in `coupling analyze` (1)")
    a.add_argument("--without-replacement", action="store_true",
                   help="the k first drafts are distinct (successive sampling)")
    a.add_argument("--length", type=int, default=None, metavar="L",
                   help="compare the law of the first L tokens (max gamma + 2)")
    a.add_argument("--id-space", type=int, default=16, metavar="N",
                   help="place the V tokens at ids of a vocabulary of N, among them 0, 1 or "
                        "N - 1 (16; 0: ids 0 .. V - 1)")
    a.add_argument("--draws", type=int, default=None, metavar="N",
                   help="generation loops per model pair (20000)")
    a.add_argument("--seed", type=int, default=0, help="seed of the models and draws (0)")
    a.add_argument("--alpha", type=float, default=1e-6, help="false-positive rate (1e-6)")
    a.add_argument("--exact", action="store_true",
                   help="exact mode: enumerate the law from NAME.law(drafts, p, q)")
    a.add_argument("--torch", action="store_true",
                   help="NAME is a batched torch verifier fn(drafts, p, q, generator)")
    a.add_argument("--ragged", action="store_true",
                   help="with --torch: padded batches, fn(..., num_drafts=[B])")
    a.add_argument("--greedy", action="store_true",
                   help="with --torch: greedy requests beside sampled ones, fn(..., greedy=[B])")
    a.add_argument("--dtype", choices=("float32", "bfloat16", "float16", "float64"),
                   default="float32", help="with --torch: the laws' dtype (float32)")
    a.add_argument("--json", action="store_true", help="print the report as JSON")
    a.add_argument("--no-minimize", action="store_true",
                   help="on a FAIL, skip the search for the smallest failing case")
    a.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    a.set_defaults(run=run)
    return a


def _gammas(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(g) for g in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected G or G,G,... (e.g. 1,2,3,4), got {text!r}") from None


def _check_kwargs(args: argparse.Namespace) -> dict:
    """The settings shared by the check and the search for the smallest failing case."""
    gamma = {} if args.gamma is None else {"gamma": args.gamma}
    return dict(vocab_size=args.vocab_size, k=args.k, replacement=not args.without_replacement,
                seed=args.seed, alpha=args.alpha, exact=args.exact, draws=args.draws,
                id_space=args.id_space or None, **gamma)


def load(spec: str):
    """The object named by ``MODULE:NAME`` (``NAME`` may be dotted)."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"expected MODULE:NAME (e.g. mypkg.spec:verify), got {spec!r}")
    if os.getcwd() not in sys.path:      # as ``python -m`` does: a module beside the user
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module!r}: {exc}") from None
    for part in name.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"module {module!r} has no attribute {name!r}") from None
    return obj


class _Bar:
    """A one-line progress bar on stderr, redrawn at most ten times a second."""

    def __init__(self, stream=sys.stderr, width: int = 30):
        self.stream, self.width, self.t0, self.last = stream, width, time.perf_counter(), 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if done < total and now - self.last < 0.1:
            return
        self.last = now
        filled = int(self.width * done / total)
        self.stream.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] "
                          f"{done}/{total} loops, {now - self.t0:.0f} s")
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()


def run(args: argparse.Namespace) -> int:
    """Run the check that ``args`` describes; print the report; return the exit status."""
    from .adapters import from_torch
    from .check import VerifierRaised, check_verifier

    try:
        verify = load(args.target)
        if args.torch:
            import torch

            verify = from_torch(verify, name=args.target, ragged=args.ragged,
                                greedy=args.greedy, dtype=getattr(torch, args.dtype))
        elif args.ragged or args.greedy:
            raise ValueError("--ragged and --greedy describe a batched torch verifier: add "
                             "--torch")
        show = not (args.no_progress or args.json or args.exact) and sys.stderr.isatty()
        report = check_verifier(verify, length=args.length, **_check_kwargs(args),
                                progress=_Bar() if show else None)
    except VerifierRaised as exc:        # the code under test failed: its traceback, a FAIL
        traceback.print_exception(exc.__cause__, file=sys.stderr)
        print(f"coupling conformance: FAIL: {exc}", file=sys.stderr)
        return 1
    except (ValueError, TypeError) as exc:
        print(f"coupling conformance: error: {flag_words(str(exc))}", file=sys.stderr)
        return 2
    found = None if report.ok or args.no_minimize else _minimize(verify, args)
    if args.json:
        out = report.to_dict()
        if found is not None:
            out["counterexample"] = {"vocab_size": found.vocab_size, "gamma": found.gamma,
                                     "pair": found.pair, "tv": found.report.tv,
                                     "strings": [list(s) for s in found.strings],
                                     "script": found.script}
        print(json.dumps(out, indent=2))
    else:
        print(report.table() + (f"\n\n{found}" if found is not None else ""))
    return 0 if report.ok else 1


def _minimize(verify, args: argparse.Namespace):
    """The smallest failing case (:func:`coupling.conformance.minimal_counterexample`)."""
    from .check import GAMMAS
    from .minimal import minimal_counterexample

    kwargs = _check_kwargs(args)
    kwargs.setdefault("gamma", GAMMAS)
    return minimal_counterexample(verify, source=args.target, **kwargs)


def main(argv: list[str] | None = None) -> int:
    """``coupling conformance ...`` (registered in the entry-point group ``coupling.commands``)."""
    parser = add_arguments(argparse.ArgumentParser(prog="coupling conformance",
                                                   description=DESCRIPTION))
    return run(parser.parse_args(sys.argv[1:] if argv is None else argv))
