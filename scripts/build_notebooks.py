"""Build the notebooks in ``notebooks/`` from their sources and execute them with outputs.

Sources live in ``notebooks/src/NN_name.py`` in the "percent" format (the format jupytext
and VS Code use): a line ``# %%`` starts a code cell, ``# %% [markdown]`` starts a markdown
cell whose lines are comments (``# `` stripped). Keeping the source as plain Python makes
reviews and diffs readable; the ``.ipynb`` is the rendered, executed artefact (plots
embedded as PNG) that a reader opens on GitHub.

Usage::

    .venv/bin/python scripts/build_notebooks.py            # build + execute all
    .venv/bin/python scripts/build_notebooks.py 01 03      # only those whose name starts so
    .venv/bin/python scripts/build_notebooks.py --no-exec  # convert only (no outputs)

The kernel is always launched with *this* interpreter (``sys.executable``), never with
whatever ``python`` a kernelspec or ``PATH`` would pick: the notebooks must see the same
environment (the ``coupling`` package, torch, ...) as the caller.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NB_DIR = ROOT / "notebooks"
SRC_DIR = NB_DIR / "src"

_CELL = re.compile(r"^# %%(?P<rest>.*)$")


class InterpreterKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel is ``sys.executable -m ipykernel_launcher``.

    The stock ``python3`` kernelspec may name a bare ``python`` (resolved via ``PATH``) or
    an absolute interpreter from another environment; either can silently run the
    notebooks against a different install. Overriding the spec pins the interpreter.
    """

    @property
    def kernel_spec(self) -> KernelSpec:  # type: ignore[override]
        return KernelSpec(
            argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            display_name="Python 3 (ipykernel)",
            language="python",
            metadata={},
        )


def kernel_env() -> dict[str, str]:
    """Kernel environment: headless inline matplotlib, offline Hugging Face, this venv first."""
    env = dict(os.environ)
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    # Agg-based and non-interactive, but unlike plain "Agg" it emits the figures as PNG
    # display data (plain Agg would silently drop every plot from the notebook).
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["PYTHONHASHSEED"] = "0"
    # the package is importable from the repository root even without an editable install
    extra = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + extra if extra else "")
    return env


def execute(
    nb: nbformat.NotebookNode, *, timeout: int = 600, cwd: Path = NB_DIR
) -> nbformat.NotebookNode:
    """Execute ``nb`` in place (and return it) with a kernel running ``sys.executable``.

    Raises ``nbclient.exceptions.CellExecutionError`` on the first cell that raises.
    """
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        kernel_manager_class=InterpreterKernelManager,
        resources={"metadata": {"path": str(cwd)}},
        allow_errors=False,
    )
    client.execute(env=kernel_env(), cwd=str(cwd))
    return nb


def parse_percent(text: str) -> nbformat.NotebookNode:
    """Turn a percent-format source into a notebook (no outputs)."""
    cells: list[tuple[str, list[str]]] = []
    kind, lines = None, []
    for line in text.splitlines():
        m = _CELL.match(line)
        if m:
            if kind is not None:
                cells.append((kind, lines))
            kind = "markdown" if "[markdown]" in m.group("rest") else "code"
            lines = []
        elif kind is not None:
            lines.append(line)
        # text before the first marker (a module docstring, say) is not part of the notebook
    if kind is not None:
        cells.append((kind, lines))
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"
    }
    nb.metadata["language_info"] = {"name": "python"}
    for kind, body in cells:
        while body and not body[-1].strip():
            body.pop()
        while body and not body[0].strip():
            body.pop(0)
        if kind == "markdown":
            md = [re.sub(r"^# ?", "", ln) if ln.startswith("#") else ln for ln in body]
            nb.cells.append(nbformat.v4.new_markdown_cell("\n".join(md)))
        else:
            nb.cells.append(nbformat.v4.new_code_cell("\n".join(body)))
    # stable cell ids: reviews should not show id churn on every rebuild
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:02d}"
    return nb


def strip_volatile(nb: nbformat.NotebookNode) -> None:
    """Drop timing metadata so a rebuild with unchanged results gives a small diff."""
    for cell in nb.cells:
        cell.metadata.pop("execution", None)


def build(src: Path, *, run: bool = True) -> tuple[Path, float]:
    nb = parse_percent(src.read_text())
    t0 = time.perf_counter()
    if run:
        execute(nb)
        strip_volatile(nb)
    elapsed = time.perf_counter() - t0
    out = NB_DIR / (src.stem + ".ipynb")
    nbformat.validate(nb)
    nbformat.write(nb, out)
    return out, elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("only", nargs="*", help="build only sources whose name starts with these")
    ap.add_argument("--no-exec", action="store_true", help="convert without executing")
    args = ap.parse_args(argv)
    sources = sorted(SRC_DIR.glob("*.py"))
    if args.only:
        sources = [s for s in sources if any(s.stem.startswith(o) for o in args.only)]
    if not sources:
        print("no notebook sources matched", file=sys.stderr)
        return 1
    for src in sources:
        out, elapsed = build(src, run=not args.no_exec)
        print(f"{out.relative_to(ROOT)}  {elapsed:7.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
