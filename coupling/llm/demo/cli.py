"""``coupling demo``'s entry point: parse, run, print, save."""

from __future__ import annotations

import json
import os
import sys

from .plot import plot
from .report import render
from .run import run
from .settings import build_parser

#: the line ``coupling --help`` shows for this command
HELP = "speculative sampling on SmolLM2-135M, every verification rule side by side"


def main(argv: list[str] | None = None) -> int:
    for key, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"),
                       ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(key, value)
    args = build_parser().parse_args(argv)
    try:
        res = run(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"coupling demo: error: {exc}", file=sys.stderr)
        return 2
    print(render(res))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2))
        print(f"wrote {args.json}")
    if args.plot:
        plot(res, args.plot)
        print(f"wrote {args.plot}")
    return 0
