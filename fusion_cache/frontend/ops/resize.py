"""Resize ops: slice, pad, cat."""
from __future__ import annotations

from .. import shapes
from ..dtypes import promote
from ..records import Record
from ..values import TensorInfo
from .base import OpsBase


class ResizeOps(OpsBase):
    def slice(self, arg, start_indices, end_indices, strides=None, manual_normalization=False):
        op = "slice"
        ref = self._tensor(arg, op)
        starts = self._size_list(start_indices, op, "start_indices")
        ends = self._size_list(end_indices, op, "end_indices")
        steps = None if strides is None else self._size_list(strides, op, "strides")

        def infer() -> list:
            info = self._info(ref)
            s, e = self._static_sizes(starts), self._static_sizes(ends)
            st = [1] * info.ndim if steps is None else self._static_sizes(steps)
            for name, v in (("start_indices", s), ("end_indices", e), ("strides", st)):
                if len(v) != info.ndim:
                    raise ValueError(f"{op}: {name} has {len(v)} entries, the tensor {info.ndim} dims")
            out = []
            for d in range(info.ndim):
                size, a, b, k = info.shape[d], s[d], e[d], st[d]
                if k is not None and k <= 0:
                    raise ValueError(f"{op}: strides[{d}] must be positive, got {k}")
                if None in (a, b, k) or size == shapes.SYMBOLIC:
                    out.append(shapes.SYMBOLIC)
                    continue
                # negative indices count from the end, as in Python (manual_normalization=False)
                a, b = (a + size if a < 0 else a), (b + size if b < 0 else b)
                if a < 0 or b < 0:
                    raise ValueError(f"{op}: slice {s[d]}:{e[d]} is out of bounds for dim {d} of size {size}")
                if b > size or a > b:
                    raise ValueError(
                        f"{op}: slice {a}:{b} is out of bounds for dim {d} of size {size}"
                    )
                out.append((b - a + k - 1) // k)
            return [TensorInfo(info.dtype, tuple(out))]

        kwargs = (("start_indices", starts), ("end_indices", ends), ("strides", steps))
        return self._apply(Record("op", op, (ref,), kwargs, self._out("T")), infer)

    def pad(self, arg, pad_widths, value=None):
        op = "pad"
        ref = self._tensor(arg, op)
        widths = self._size_list(pad_widths, op, "pad_widths")
        val = None if value is None else self._ref(value, op, "value", "S")

        def infer() -> list:
            info = self._info(ref)
            w = self._static_sizes(widths)
            if len(w) % 2 or len(w) > 2 * info.ndim:
                raise ValueError(
                    f"{op}: pad_widths needs an even number of entries, at most {2 * info.ndim}"
                )
            out = list(info.shape)
            for i in range(len(w) // 2):
                d = info.ndim - 1 - i
                lo, hi = w[2 * i], w[2 * i + 1]
                if None in (lo, hi) or out[d] == shapes.SYMBOLIC:
                    out[d] = shapes.SYMBOLIC
                else:
                    out[d] = out[d] + lo + hi
                    if out[d] < 0:
                        raise ValueError(f"{op}: padding makes dim {d} negative")
            return [TensorInfo(info.dtype, tuple(out))]

        kwargs = (("pad_widths", widths), ("value", val))
        return self._apply(Record("op", op, (ref,), kwargs, self._out("T")), infer)

    def cat(self, tensors, dim=0, manual_padding=False):
        op = "cat"
        if not isinstance(tensors, (list, tuple)) or not tensors:
            raise TypeError(f"{op}: tensors must be a non-empty list of tensors")
        refs = tuple(self._tensor(t, op, f"tensors[{i}]") for i, t in enumerate(tensors))

        def infer() -> list:
            infos = [self._info(r) for r in refs]
            rank = infos[0].ndim
            for i, t in enumerate(infos):
                if t.ndim != rank:
                    raise ValueError(f"{op}: tensors[{i}] has rank {t.ndim}, tensors[0] {rank}")
            d = shapes.normalize_dim(dim, rank, op)
            out = []
            for k in range(rank):
                col = [t.shape[k] for t in infos]
                if k == d:
                    out.append(shapes.SYMBOLIC if shapes.SYMBOLIC in col else sum(col))
                    continue
                static = [(i, c) for i, c in enumerate(col) if c not in (1, shapes.SYMBOLIC)]
                for i, c in static[1:]:
                    if c != static[0][1]:
                        raise ValueError(
                            f"{op}: tensors[{i}] has size {c} at dim {k} but tensors[{static[0][0]}] "
                            f"has {static[0][1]}; all dims but the cat dim {d} must agree"
                        )
                out.append(shapes.broadcast_shapes(op, [(c,) for c in col])[0])
            dtype = promote(tuple((2, t.dtype) for t in infos))
            return [TensorInfo(dtype, tuple(out))]

        return self._apply(Record("op", op, (refs,), (("dim", dim),), self._out("T")), infer)
