r"""Rows of the laws in float64, a chunk of rows at a time: sums, normalised rows, residual masses.

Laws reach the twins as ``[..., V]`` tensors in any float dtype; float32 rows sum to 1 only
within about ``1e-5``, float16 / bfloat16 rows within ``1e-2``. Every twin computes on the
float64-normalised laws :math:`p / \sum_y p(y)` per row, the numpy cores' arithmetic
(:func:`coupling.lm.check_tree`), so its output law is exactly the law of the
normalised target whatever the input precision (rules that use unnormalised rows would emit
``max(p - q, 0)`` residuals of the wrong mass: about 1% in total variation for half-precision
laws).

The float64 values exist only a chunk of rows at a time (:func:`chunk_rows`), never for a whole
``[B, k, gamma + 1, V]`` tensor: ``x.sum(-1, dtype=torch.float64)`` and ``x.double()``
materialise a float64 copy of ``x``, twice the memory of float32 laws, where a chunk cast in
turn stays in a core's cache across the passes over it.

Rows are named by ``index``: a tuple of int64 ``[R]`` tensors over the leading axes of ``x``
(``x[index]`` is ``[R, V]``), or ``None`` for every row of ``x`` in order.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["chunk_rows", "by_row_chunks", "rows", "row_sums", "normalised_rows",
           "residual_masses", "residual_weights"]

#: float64 elements per chunk on the CPU (512 KiB: one row of V = 49152)
CPU_CHUNK = 1 << 16
#: float64 elements per chunk on an accelerator (fewer kernel launches; 128 MiB)
DEVICE_CHUNK = 1 << 24
#: named rows gathered in one call when they hold at most this many entries (in ``x``'s
#: dtype: a fraction of the laws), else a chunk at a time
GATHER_AT_MOST = 1 << 22

Index = tuple[torch.Tensor, ...]


def chunk_rows(V: int, device: torch.device) -> int:
    """Rows of ``V`` entries per float64 chunk on ``device``."""
    per = CPU_CHUNK if device.type == "cpu" else DEVICE_CHUNK
    return max(1, per // max(V, 1))


def by_row_chunks(fn, V: int, *rows: torch.Tensor) -> torch.Tensor:
    """``fn(*rows)`` computed a chunk of rows at a time (:func:`chunk_rows` rows of ``V``
    entries) and concatenated: for a row-wise ``fn`` whose float64 temporaries over ``[n, V]``
    would otherwise exceed the laws themselves. ``rows``: tensors sharing their first axis."""
    n, step = rows[0].shape[0], chunk_rows(V, rows[0].device)
    if n <= step:
        return fn(*rows)
    return torch.cat([fn(*(r[a:a + step] for r in rows)) for a in range(0, n, step)])


def _row_grid(x: torch.Tensor) -> tuple[torch.Tensor, list[int]] | None:
    """``x [..., V]`` as a 2-D view of the rows of its storage and each leading axis' stride
    in rows, so that ``x[index]`` is ``grid.index_select(0, sum_d index[d] * strides[d])``;
    None when the rows do not sit on one grid (the last axis not contiguous)."""
    V = x.shape[-1]
    if x.ndim < 2 or V == 0 or x.stride(-1) != 1 or any(s % V for s in x.stride()[:-1]):
        return None
    strides = [s // V for s in x.stride()[:-1]]
    n = 1 + sum((d - 1) * s for d, s in zip(x.shape[:-1], strides, strict=True))
    return x.as_strided((n, V), (V, 1), x.storage_offset()), strides


def _row_ids(x: torch.Tensor, index: Index | None, strides: list[int]) -> torch.Tensor:
    """Each named row's index on :func:`_row_grid`'s grid."""
    if index is None:
        ids = torch.zeros((), dtype=torch.int64, device=x.device)
        for d, s in zip(x.shape[:-1], strides, strict=True):
            ids = (ids.unsqueeze(-1) + s * torch.arange(d, device=x.device)).flatten()
        return ids
    ids = None
    for i, s in zip(index, strides, strict=True):
        if s:  # an expanded axis adds nothing
            term = i if s == 1 else i * s
            ids = term if ids is None else ids + term
    return torch.zeros_like(index[0]) if ids is None else ids


Take = Callable[[int, int], torch.Tensor]


def _source(x: torch.Tensor, index: Index | None) -> tuple[int, Take]:
    """``(n, take)``: the number of rows named (module doc) and ``take(lo, hi)``, the rows
    ``lo:hi`` as ``[hi - lo, V]`` in ``x``'s dtype (views where they are consecutive in
    memory, copies otherwise)."""
    V = x.shape[-1]
    x = x.detach()  # laws of a draft in training: the twins differentiate nothing
    if x.numel() == 0 or (index is not None and index[0].numel() == 0):
        return 0, lambda lo, hi: x.new_empty(0, V)
    if index is None and x.is_contiguous():
        flat = x.view(-1, V)
        return flat.shape[0], lambda lo, hi: flat[lo:hi]
    grid = _row_grid(x)
    if grid is None:
        rows = x.reshape(-1, V) if index is None else x[index]
        return rows.shape[0], lambda lo, hi: rows[lo:hi]
    flat, strides = grid
    ids = _row_ids(x, index, strides)
    n = ids.shape[0]
    if n == 1 and x.device.type == "cpu":  # one row: a view (reading its id costs no sync)
        row = flat[int(ids):].narrow(0, 0, 1)
        return 1, lambda lo, hi: row
    if chunk_rows(V, x.device) == 1 and x.device.type == "cpu":
        # a chunk is one row: read it in place (a gather would copy it once more)
        at = ids.tolist()
        return n, lambda lo, hi: flat[at[lo]:at[lo] + 1]
    if n * V <= GATHER_AT_MOST:  # one gather in x's dtype, then chunks of it
        rows = flat.index_select(0, ids)
        return n, lambda lo, hi: rows[lo:hi]
    return n, lambda lo, hi: flat.index_select(0, ids[lo:hi])


def _spans(n: int, x: torch.Tensor) -> list[tuple[int, int]]:
    step = chunk_rows(x.shape[-1], x.device)
    return [(lo, min(lo + step, n)) for lo in range(0, n, step)]


def _leading(x: torch.Tensor, index: Index | None) -> tuple[int, ...]:
    return tuple(x.shape[:-1]) if index is None else (index[0].numel(),)


def _float64(rows: torch.Tensor, buf: torch.Tensor | None) -> torch.Tensor:
    """``rows`` cast to float64 into a tensor of their own (``buf``'s first rows, if given)."""
    if buf is None:
        return rows.to(torch.float64, copy=True)
    return buf[: rows.shape[0]].copy_(rows)


def _buffer(x: torch.Tensor, n: int) -> torch.Tensor | None:
    """One float64 chunk reused across the chunks of ``n`` rows (None for a single chunk)."""
    step = chunk_rows(x.shape[-1], x.device)
    if n <= step:
        return None
    return torch.empty(step, x.shape[-1], dtype=torch.float64, device=x.device)


def rows(x: torch.Tensor, index: Index) -> torch.Tensor:
    """``x[index]`` ``[R, V]`` in ``x``'s dtype: a view for one row (on a CPU, where reading its
    id costs no sync), a gather otherwise; detached, as :func:`_source` reads them."""
    x = x.detach()
    if index[0].numel() == 1 and x.device.type == "cpu":
        return x[tuple(int(i) for i in index)].unsqueeze(0)
    return x[index]


def row_sums(x: torch.Tensor, index: Index | None = None) -> torch.Tensor:
    """Float64 sums of the rows of ``x [..., V]``: ``[...]``, or ``[R]`` for ``x[index]``."""
    lead = _leading(x, index)
    n, take = _source(x, index)
    spans = _spans(n, x)
    if len(spans) <= 1:
        return take(0, n).to(torch.float64).sum(-1).view(lead)
    out = torch.empty(n, dtype=torch.float64, device=x.device)
    buf = _buffer(x, n)
    for lo, hi in spans:
        torch.sum(_float64(take(lo, hi), buf), -1, out=out[lo:hi])
    return out.view(lead)


def normalised_rows(x: torch.Tensor, index: Index | None = None, *,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """``x[index] / sum`` per row, float64 ``[R, V]`` (``[N, V]``, every row in order, when
    ``index`` is None): the laws the rules compute on (module doc). A row summing to 0 (no
    law: only unvalidated input has one) stays 0. ``out``: float64 rows to write into (its
    first ``R``), for a caller that reuses them across calls."""
    one = index is not None and index[0].numel() == 1 and x.device.type == "cpu"
    n, take = (1, None) if one else _source(x, index)  # one row (the common call): read in place
    if out is None:
        out = torch.empty(n, x.shape[-1], dtype=torch.float64, device=x.device)
    if one:
        return _normalise(out[:1].copy_(rows(x, index)))
    out = out[:n]
    for lo, hi in _spans(n, x):
        _normalise(out[lo:hi].copy_(take(lo, hi)))
    return out


def _normalise(o: torch.Tensor) -> torch.Tensor:
    """Float64 rows ``o`` divided in place by their sums (a row of no mass stays 0)."""
    s = o.sum(-1, keepdim=True)
    return o.div_(torch.where(s > 0, s, 1.0))


def residual_masses(p: torch.Tensor, q: torch.Tensor, index_p: Index, index_q: Index,
                    a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    r""":math:`\sum_y \max(a_r p_r(y) - b_r q_r(y), 0)` per row ``r`` of ``p[index_p]``,
    ``q[index_q]`` (``a``, ``b`` float64 ``[R]``), float64 ``[R]``."""
    n, take_p = _source(p, index_p)
    _, take_q = _source(q, index_q)
    out = torch.empty(n, dtype=torch.float64, device=p.device)
    bp, bq = _buffer(p, n), _buffer(q, n)
    for lo, hi in _spans(n, p):
        t = _float64(take_p(lo, hi), bp).mul_(a[lo:hi, None])
        t.sub_(_float64(take_q(lo, hi), bq).mul_(b[lo:hi, None])).clamp_(min=0.0)
        torch.sum(t, -1, out=out[lo:hi])
    return out


def residual_weights(p: torch.Tensor, q: torch.Tensor, index_p: Index, index_q: Index,
                     a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    r""":math:`\max(a_r p_r - b_r q_r, 0)` per row ``r`` of ``p[index_p]``, ``q[index_q]``
    (``a``, ``b`` float64 ``[R]``; with ``b_r = 0`` the row is :math:`a_r p_r`), float64
    ``[R, V]``."""
    n, take_p = _source(p, index_p)
    _, take_q = _source(q, index_q)
    out = torch.empty(n, p.shape[-1], dtype=torch.float64, device=p.device)
    bq = _buffer(q, n)
    for lo, hi in _spans(n, p):
        o = out[lo:hi].copy_(take_p(lo, hi)).mul_(a[lo:hi, None])
        o.sub_(_float64(take_q(lo, hi), bq).mul_(b[lo:hi, None])).clamp_(min=0.0)
    return out
