r"""Static draft-tree topologies: which drafted token hangs under which, before any is drawn.

A :class:`Tree` has nodes ``0..N-1``; ``parent[n]`` is the node the draft of ``n`` continues
(``-1``: the context, the tree's root) and every parent comes before its children, so the
nodes are in a drafting order. The drafter fills the tree top-down: the children of a node
are drafted from the draft's law after that node's prefix, all at once, by one of three laws
(``children``):

``"iid"``
    i.i.d. draws (SpecInfer, SpecTr and Sequoia's sampling trees); siblings may coincide;
``"distinct"``
    successive draws without replacement (Gumbel-top-k; distinct siblings);
``"topk"``
    the likeliest tokens of the law, in order (Medusa and EAGLE's static trees, EAGLE-2's
    top-k expansion): no randomness at all, child ``r`` is the ``r``-th likeliest token.

Engines write trees in three forms, each a constructor here:

* per-depth branching, :meth:`Tree.from_branching` (``[3, 2, 1]``: three children of the root,
  two under each of them, one under each of those);
* a list of paths of child ranks, :meth:`Tree.from_paths` (Medusa's ``medusa_choices``,
  EAGLE's ``tree_choices``, vLLM and SGLang's tree layouts): ``(0, 1)`` is the second child
  of the first child of the root;
* ``k`` chains of ``gamma`` tokens, :meth:`Tree.from_chains`, the trees of the rest of this
  package (``k`` i.i.d. branches, or distinct first tokens).

>>> t = Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])
>>> t.size, t.depth, t.parent
(5, 3, (-1, -1, 0, 0, 2))
>>> Tree.from_branching([3, 2]).parent
(-1, -1, -1, 0, 0, 1, 1, 2, 2)
>>> Tree.named("eagle", size=8).paths()[:4]
[(0,), (1,), (2,), (3,)]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["Tree", "CHILD_LAWS", "NAMED"]

#: how the children of a node are drafted (module doc)
CHILD_LAWS = ("iid", "distinct", "topk")

#: Published static trees, as lists of paths of child ranks, likeliest first, so that the first
#: ``n`` paths are a tree too (``Tree.named(name, size=n)``)
NAMED: dict[str, tuple[tuple[int, ...], ...]] = {
    # Medusa's default, ``mc_sim_7b_63`` in medusa/model/medusa_choices.py (Cai et al. 2024)
    "medusa": (
        (0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0), (1, 0), (0, 2), (3,), (0, 3), (4,), (0, 4),
        (2, 0), (0, 5), (0, 0, 1), (5,), (0, 6), (6,), (0, 7), (0, 1, 0), (1, 1), (7,), (0, 8),
        (0, 0, 2), (3, 0), (0, 9), (8,), (9,), (1, 0, 0), (0, 2, 0), (1, 2), (0, 0, 3), (4, 0),
        (2, 1), (0, 0, 4), (0, 0, 5), (0, 0, 0, 0), (0, 1, 1), (0, 0, 6), (0, 3, 0), (5, 0),
        (1, 3), (0, 0, 7), (0, 0, 8), (0, 0, 9), (6, 0), (0, 4, 0), (1, 4), (7, 0), (0, 1, 2),
        (2, 0, 0), (3, 1), (2, 2), (8, 0), (0, 5, 0), (1, 5), (1, 0, 1), (0, 2, 1), (9, 0),
        (0, 6, 0), (0, 0, 0, 1), (1, 6), (0, 7, 0)),
    # EAGLE's default ``tree_choices`` (``mc_sim_7b_63`` in eagle/model/choices.py, Li et al.
    # 2024): 25 nodes, depth 5
    "eagle": (
        (0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
        (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0),
        (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1)),
    # SpecInfer's expansion <1, 1, 3, 1, 1, 1, 1, 1> (Miao et al. 2024): a chain of two, three
    # children, then three chains
    "specinfer": tuple([(0,), (0, 0)] + [(0, 0, r) for r in range(3)]
                       + [(0, 0, r) + (0,) * d for d in range(1, 6) for r in range(3)]),
}


@dataclass(frozen=True)
class Tree:
    """A static draft tree: ``parent[n]`` for nodes ``0..N-1`` (``-1``: the root), and how the
    children of a node are drafted (``children``, :data:`CHILD_LAWS`).

    ``ValueError`` names what is wrong with a bad topology: an empty tree, a node whose parent
    comes after it (a cycle is such a node), an unknown child law.
    """

    parent: tuple[int, ...]
    children: str = "iid"
    kids: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)
    depths: tuple[int, ...] = field(init=False, repr=False, compare=False)
    columns: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parent = tuple(self.parent)
        if not parent:
            raise ValueError("a draft tree needs at least one node; for no speculation draft "
                             "nothing at all")
        for n, a in enumerate(parent):
            if isinstance(a, bool) or not isinstance(a, int) or not -1 <= a < n:
                raise ValueError(f"parent[{n}] = {a!r}: every node's parent must be -1 (the "
                                 "root) or an earlier node (this also rules out cycles); list "
                                 "the nodes in drafting order")
        if self.children not in CHILD_LAWS:
            raise ValueError(f"children={self.children!r} is no child law; choose one of "
                             f"{', '.join(CHILD_LAWS)}")
        kids: list[list[int]] = [[] for _ in range(len(parent) + 1)]   # the root is last
        depths: list[int] = []
        columns: list[int] = []          # each node's index among the nodes of its depth
        seen: dict[int, int] = {}
        for n, a in enumerate(parent):
            kids[a].append(n)
            depths.append(1 if a < 0 else depths[a] + 1)
            columns.append(seen.get(depths[-1], 0))
            seen[depths[-1]] = columns[-1] + 1
        object.__setattr__(self, "parent", parent)
        object.__setattr__(self, "kids", tuple(tuple(c) for c in kids))
        object.__setattr__(self, "depths", tuple(depths))
        object.__setattr__(self, "columns", tuple(columns))

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_paths(cls, paths: Iterable[Sequence[int]], children: str = "iid") -> Tree:
        """The tree of a list of paths of child ranks (``(0, 1)``: second child of the first
        child of the root), in the list's order; every path's parent path must come before it
        and a node's ranks must run ``0, 1, 2, ...`` in order."""
        index: dict[tuple[int, ...], int] = {}
        parent = []
        for raw in paths:
            path = tuple(int(r) for r in raw)
            if not path or min(path) < 0:
                raise ValueError(f"path {tuple(raw)!r} must be a non-empty tuple of child ranks "
                                 ">= 0")
            if path in index:
                raise ValueError(f"path {path} appears twice")
            up = path[:-1]
            if up and up not in index:
                raise ValueError(f"path {path} comes before its parent {up}: list a node's "
                                 "parent first")
            a = index[up] if up else -1
            rank = sum(parent[m] == a for m in range(len(parent)))
            if path[-1] != rank:
                raise ValueError(f"path {path} is child rank {path[-1]} of {up or 'the root'}, "
                                 f"but that node has {rank} children before it: ranks run "
                                 "0, 1, 2, ... in the list's order")
            index[path] = len(parent)
            parent.append(a)
        return cls(tuple(parent), children)

    @classmethod
    def from_branching(cls, widths: Sequence[int], children: str = "iid") -> Tree:
        """``widths[d]`` children under every node of depth ``d`` (``[3, 2, 1]``: 3 + 6 + 6
        nodes), listed depth by depth."""
        if not widths or any(isinstance(w, bool) or not isinstance(w, int) or w < 1
                             for w in widths):
            raise ValueError(f"widths must be a non-empty list of positive ints, got {widths!r}")
        parent, level = [], [-1]
        for w in widths:
            nxt = []
            for a in level:
                for _ in range(w):
                    nxt.append(len(parent))
                    parent.append(a)
            level = nxt
        return cls(tuple(parent), children)

    @classmethod
    def from_chains(cls, k: int, gamma: int, *, replacement: bool = True) -> Tree:
        """``k`` branches of ``gamma`` tokens: the root's ``k`` children (i.i.d., or distinct
        with ``replacement=False``), each continued as a chain; branch ``j`` is nodes
        ``j, j + k, j + 2k, ...``."""
        for name, v in (("k", k), ("gamma", gamma)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        parent = [-1] * k + [n for n in range(k * (gamma - 1))]
        return cls(tuple(parent), "iid" if replacement or k == 1 else "distinct")

    @classmethod
    def chain(cls, gamma: int) -> Tree:
        """One branch of ``gamma`` tokens."""
        return cls.from_chains(1, gamma)

    @classmethod
    def named(cls, name: str, *, size: int | None = None, children: str = "topk") -> Tree:
        """A published tree of :data:`NAMED` (``"medusa"``, ``"eagle"``, ``"specinfer"``), or
        its first ``size`` nodes. Medusa and EAGLE draft the top-k children of each node;
        ``children`` says how this tree's are drafted."""
        if name not in NAMED:
            raise ValueError(f"unknown tree {name!r}; named trees: {', '.join(NAMED)}")
        paths = NAMED[name]
        if size is not None and (isinstance(size, bool) or not isinstance(size, int)
                                 or not 1 <= size <= len(paths)):
            raise ValueError(f"size must be an int in [1, {len(paths)}] for {name!r}, got "
                             f"{size!r}")
        return cls.from_paths(paths[:size], children)

    @classmethod
    def from_spec(cls, spec: str, children: str = "iid") -> Tree:
        """A tree written on a command line: per-depth widths ``"3,2,1"``
        (:meth:`from_branching`), a named tree and its size ``"eagle:16"`` (:meth:`named`), a
        JSON list of paths ``"[[0], [1], [0, 0]]"`` or a JSON file holding one
        (:meth:`from_paths`).

        >>> Tree.from_spec("eagle:8").size, Tree.from_spec("3,1").size
        (8, 6)
        """
        text = str(spec).strip()
        if text.startswith("["):
            import json

            try:
                return cls.from_paths(json.loads(text), children)
            except json.JSONDecodeError as exc:
                raise ValueError(f"tree {text!r}: not a JSON list of paths ({exc})") from None
        if text.endswith(".json"):
            import json
            from pathlib import Path

            try:
                paths = json.loads(Path(text).read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise ValueError(f"tree file {text}: {exc}") from None
            return cls.from_paths(paths, children)
        name, _, size = text.partition(":")
        if name in NAMED:
            if size and not size.isdigit():
                raise ValueError(f"tree {text!r}: the size after ':' must be an int")
            return cls.named(name, size=int(size) if size else None, children=children)
        try:
            widths = [int(w) for w in text.split(",")]
        except ValueError:
            raise ValueError(f"tree {text!r}: give per-depth widths such as 3,2,1, a named tree "
                             f"({', '.join(NAMED)}, optionally :size) or a .json file of "
                             "paths") from None
        return cls.from_branching(widths, children)

    # ------------------------------------------------------------------ structure
    @property
    def size(self) -> int:
        """The number of drafted tokens, ``N``."""
        return len(self.parent)

    @property
    def depth(self) -> int:
        """The longest root-to-node path (the most tokens one call can accept)."""
        return max(self.depths)

    def depth_of(self, n: int) -> int:
        """``1`` for a child of the root."""
        return self.depths[n]

    def children_of(self, n: int) -> tuple[int, ...]:
        """The children of node ``n`` in order (``n = -1``: the root's)."""
        return self.kids[n]

    def path_to(self, n: int) -> list[int]:
        """The nodes from the root's child down to ``n`` (``[]`` for ``n = -1``, the root).

        >>> Tree.from_branching([2, 2]).path_to(5)
        [1, 5]
        """
        if not -1 <= n < self.size:
            raise ValueError(f"node {n} is not in this {self.size}-node tree")
        out = []
        while n >= 0:
            out.append(n)
            n = self.parent[n]
        return out[::-1]

    def paths(self) -> list[tuple[int, ...]]:
        """Every node as its path of child ranks from the root (:meth:`from_paths`'s form)."""
        rank = {c: r for a in range(-1, self.size) for r, c in enumerate(self.kids[a])}
        out = []
        for n in range(self.size):
            path, m = [], n
            while m >= 0:
                path.append(rank[m])
                m = self.parent[m]
            out.append(tuple(reversed(path)))
        return out

    def chains(self) -> tuple[int, int, bool] | None:
        """``(k, gamma, replacement)`` when this is :meth:`from_chains`'s tree, else ``None``."""
        k = len(self.kids[-1])
        if self.size % k or self.children == "topk":
            return None
        gamma = self.size // k
        if Tree.from_chains(k, gamma, replacement=self.children == "iid").parent != self.parent:
            return None
        return k, gamma, self.children == "iid"
