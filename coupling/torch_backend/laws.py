r"""Rows of the laws in float64, a chunk of rows at a time: sums, normalised rows, residual masses.

Laws reach the twins as ``[..., V]`` tensors in any float dtype; float32 rows sum to 1 only
within about ``1e-5``, float16 / bfloat16 rows within ``1e-2``. Every twin computes on the
float64-normalised laws :math:`p / \sum_y p(y)` per row, the numpy cores' arithmetic
(:func:`coupling.sequence.models.check_tree`), so its output law is exactly the law of the
normalised target whatever the input precision (rules that use unnormalised rows would emit
``max(p - q, 0)`` residuals of the wrong mass: about 1% in total variation for half-precision
laws).

The float64 values exist only a chunk of rows at a time (:func:`chunk_rows`), never for a whole
``[B, k, gamma + 1, V]`` tensor. Why: ``x.sum(-1, dtype=torch.float64)`` and ``x.double()``
materialise a float64 copy of ``x`` (twice the memory of float32 laws) and, on the CPU, run
6x slower than casting and summing two rows at a time, which stay in a core's cache across
the passes over them (``benchmarks/bench_twins.py``).

Rows are named by ``index``: a tuple of int64 ``[R]`` tensors over the leading axes of ``x``
(``x[index]`` is ``[R, V]``), or ``None`` for every row of ``x`` in order.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

__all__ = ["chunk_rows", "row_sums", "normalised_rows", "residual_masses", "residual_weights"]

#: float64 elements per chunk on the CPU (1 MiB: two rows of V = 49152)
CPU_CHUNK = 1 << 17
#: float64 elements per chunk on an accelerator (fewer kernel launches; 128 MiB)
DEVICE_CHUNK = 1 << 24

Index = tuple[torch.Tensor, ...]


def chunk_rows(V: int, device: torch.device) -> int:
    """Rows of ``V`` entries per float64 chunk on ``device``."""
    per = CPU_CHUNK if device.type == "cpu" else DEVICE_CHUNK
    return max(1, per // max(V, 1))


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
    if index is None:
        ids = torch.zeros((), dtype=torch.int64, device=x.device)
        for d, s in zip(x.shape[:-1], strides, strict=True):
            ids = (ids.unsqueeze(-1) + s * torch.arange(d, device=x.device)).flatten()
        return ids
    ids = torch.zeros_like(index[0])
    for i, s in zip(index, strides, strict=True):
        ids = ids + s * i
    return ids


def _chunks(x: torch.Tensor, index: Index | None) -> Iterator[tuple[int, int, torch.Tensor]]:
    """``(start, stop, rows [stop - start, V])``: the rows of ``x`` (module doc) in chunks,
    in ``x``'s dtype (views where they are consecutive, copies otherwise)."""
    V = x.shape[-1]
    n = math.prod(x.shape[:-1]) if index is None else index[0].numel()
    step = chunk_rows(V, x.device)
    x = x.detach()  # laws of a draft in training: the twins differentiate nothing
    if index is None and x.is_contiguous():
        flat = x.view(-1, V)
        for a in range(0, n, step):
            yield a, min(a + step, n), flat[a : a + step]
        return
    grid = _row_grid(x)
    if grid is None:
        rows = x.reshape(-1, V) if index is None else x[index]
        for a in range(0, n, step):
            yield a, min(a + step, n), rows[a : a + step]
        return
    flat, strides = grid
    ids = _row_ids(x, index, strides)
    for a in range(0, n, step):
        yield a, min(a + step, n), flat.index_select(0, ids[a : a + step])


def _buffers(x: torch.Tensor, n: int) -> list[torch.Tensor]:
    """``n`` float64 chunk buffers for rows of ``x`` (reused across chunks: no allocation per
    chunk)."""
    shape = (chunk_rows(x.shape[-1], x.device), x.shape[-1])
    return [torch.empty(shape, dtype=torch.float64, device=x.device) for _ in range(n)]


def _leading(x: torch.Tensor, index: Index | None) -> tuple[int, ...]:
    return tuple(x.shape[:-1]) if index is None else (index[0].numel(),)


def row_sums(x: torch.Tensor, index: Index | None = None) -> torch.Tensor:
    """Float64 sums of the rows of ``x [..., V]``: ``[...]``, or ``[R]`` for ``x[index]``."""
    lead = _leading(x, index)
    out = torch.empty(math.prod(lead), dtype=torch.float64, device=x.device)
    (buf,) = _buffers(x, 1)
    for lo, hi, rows in _chunks(x, index):
        torch.sum(buf[: hi - lo].copy_(rows), -1, out=out[lo:hi])
    return out.view(lead)


def normalised_rows(x: torch.Tensor, index: Index | None = None) -> torch.Tensor:
    """``x[index] / sum`` per row, float64 ``[R, V]`` (``[N, V]``, every row in order, when
    ``index`` is None): the laws the rules compute on (module doc). A row summing to 0 (no
    law: only unvalidated input has one) stays 0."""
    V = x.shape[-1]
    out = torch.empty(math.prod(_leading(x, index)), V, dtype=torch.float64, device=x.device)
    for lo, hi, rows in _chunks(x, index):
        o = out[lo:hi].copy_(rows)
        s = o.sum(-1, keepdim=True)
        o.div_(torch.where(s > 0, s, 1.0))
    return out


def residual_masses(p: torch.Tensor, q: torch.Tensor, index_p: Index, index_q: Index,
                    a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    r""":math:`\sum_y \max(a_r p_r(y) - b_r q_r(y), 0)` per row ``r`` of ``p[index_p]``,
    ``q[index_q]`` (``a``, ``b`` float64 ``[R]``), float64 ``[R]``."""
    out = torch.empty(index_p[0].numel(), dtype=torch.float64, device=p.device)
    bp, bq = _buffers(p, 2)
    for (lo, hi, prow), (_, _, qrow) in zip(_chunks(p, index_p), _chunks(q, index_q),
                                            strict=True):
        t = bp[: hi - lo].copy_(prow).mul_(a[lo:hi, None])
        t.sub_(bq[: hi - lo].copy_(qrow).mul_(b[lo:hi, None])).clamp_(min=0.0)
        torch.sum(t, -1, out=out[lo:hi])
    return out


def residual_weights(p: torch.Tensor, q: torch.Tensor, index_p: Index, index_q: Index,
                     a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    r""":math:`\max(a_r p_r - b_r q_r, 0)` per row ``r`` of ``p[index_p]``, ``q[index_q]``
    (``a``, ``b`` float64 ``[R]``; with ``b_r = 0`` the row is :math:`a_r p_r`), float64
    ``[R, V]``."""
    V = p.shape[-1]
    out = torch.empty(index_p[0].numel(), V, dtype=torch.float64, device=p.device)
    (bq,) = _buffers(q, 1)
    for (lo, hi, prow), (_, _, qrow) in zip(_chunks(p, index_p), _chunks(q, index_q),
                                            strict=True):
        o = out[lo:hi].copy_(prow).mul_(a[lo:hi, None])
        o.sub_(bq[: hi - lo].copy_(qrow).mul_(b[lo:hi, None])).clamp_(min=0.0)
    return out
