"""View, layout and shape ops: broadcast, broadcast_in_dim, expand, reshape, permute, squeeze,
stride_order, size, shape."""
from __future__ import annotations

from .. import shapes
from ..dtypes import DataType
from ..records import Record
from ..values import ScalarInfo, TensorInfo, VectorInfo
from .base import OpsBase


class ShapeOps(OpsBase):
    def broadcast(self, arg, is_broadcast_dim):
        op = "broadcast"
        ref = self._tensor(arg, op)
        if not isinstance(is_broadcast_dim, (list, tuple)) or not all(
            isinstance(b, bool) for b in is_broadcast_dim
        ):
            raise TypeError(f"{op}: is_broadcast_dim must be a list of bools (True where a new "
                            f"broadcast dim goes), got {is_broadcast_dim!r}")  # fmt: skip
        flags = tuple(is_broadcast_dim)

        def infer() -> list:
            info = self._info(ref)
            if len(flags) - sum(flags) != info.ndim:
                raise ValueError(
                    f"{op}: is_broadcast_dim {list(flags)} has {len(flags) - sum(flags)} False "
                    f"entries but the tensor has rank {info.ndim}"
                )
            it = iter(info.shape)
            return [TensorInfo(info.dtype, tuple(1 if f else next(it) for f in flags))]

        record = Record("op", op, (ref,), (("is_broadcast_dim", flags),), self._out("T"))
        return self._apply(record, infer)

    def broadcast_in_dim(self, arg, shape, broadcast_dims):
        op = "broadcast_in_dim"
        ref = self._tensor(arg, op)
        sizes = self._size_list(shape, op, "shape")
        if not isinstance(broadcast_dims, (list, tuple)):
            raise TypeError(f"{op}: broadcast_dims must be a list of ints, got {broadcast_dims!r}")
        bdims = tuple(broadcast_dims)

        def infer() -> list:
            info = self._info(ref)
            target = _target_sizes(op, self._static_sizes(sizes))
            if len(bdims) != info.ndim:
                raise ValueError(
                    f"{op}: broadcast_dims {list(bdims)} must have one entry per input dim "
                    f"({info.ndim})"
                )
            if len(target) < info.ndim:
                raise ValueError(f"{op}: shape has rank {len(target)} < input rank {info.ndim}")
            norm = shapes.normalize_dims(bdims, len(target), op, "broadcast_dims")
            if list(norm) != sorted(norm):
                raise ValueError(f"{op}: broadcast_dims {list(bdims)} must be increasing")
            out = [shapes.SYMBOLIC if t is None else t for t in target]
            for src, dst in enumerate(norm):
                have, want = info.shape[src], target[dst]
                if want == -1 or want is None:
                    out[dst] = have if want == -1 else (have if have not in (1,) else -1)
                elif have not in (1, shapes.SYMBOLIC) and have != want:
                    raise ValueError(
                        f"{op}: input dim {src} has size {have} but shape[{dst}] is {want}"
                    )
            return [TensorInfo(info.dtype, tuple(out))]

        kwargs = (("shape", sizes), ("broadcast_dims", bdims))
        return self._apply(Record("op", op, (ref,), kwargs, self._out("T")), infer)

    def expand(self, arg, shape):
        op = "expand"
        ref = self._tensor(arg, op)
        sizes = self._size_list(shape, op, "shape")

        def infer() -> list:
            info = self._info(ref)
            target = _target_sizes(op, self._static_sizes(sizes))
            if len(target) != info.ndim:
                raise ValueError(f"{op}: shape has rank {len(target)}, the tensor {info.ndim}")
            out = []
            for d, (have, want) in enumerate(zip(info.shape, target)):
                if want is None:
                    out.append(shapes.SYMBOLIC if have in (1, shapes.SYMBOLIC) else have)
                elif want == -1:
                    out.append(have)
                elif have not in (1, shapes.SYMBOLIC) and have != want:
                    raise ValueError(f"{op}: cannot expand dim {d} of size {have} to {want}")
                else:
                    out.append(want)
            return [TensorInfo(info.dtype, tuple(out))]

        return self._apply(Record("op", op, (ref,), (("shape", sizes),), self._out("T")), infer)

    def reshape(self, arg, new_shape, *extra, original_shape=None):
        op = "reshape"
        if extra:  # early spelling: reshape(arg, original_shape, new_shape)
            original_shape, new_shape = new_shape, extra[0]
        ref = self._tensor(arg, op)
        sizes = self._size_list(new_shape, op, "new_shape")
        outs = self._out("T")
        where = f"{op} ({outs[0]})"
        if original_shape is not None:
            have = self._info(ref).shape
            orig = list(original_shape)
            if len(orig) != len(have) or any(
                h not in (shapes.SYMBOLIC, 1) and o != h for o, h in zip(orig, have)
            ):
                raise ValueError(f"{where}: original_shape {orig} does not match the tensor "
                                 f"{shapes.format_shape(have, codes=True)}")  # fmt: skip

        def infer() -> list:
            info = self._info(ref)
            new = shapes.infer_reshape(where, info.shape, self._static_sizes(sizes))
            return [TensorInfo(info.dtype, new)]

        return self._apply(Record("op", op, (ref,), (("new_shape", sizes),), outs), infer)

    def permute(self, arg, dims):
        op = "permute"
        ref = self._tensor(arg, op)
        order = tuple(dims)

        def infer() -> list:
            info = self._info(ref)
            norm = shapes.normalize_dims(order, info.ndim, op)
            if len(norm) != info.ndim:
                raise ValueError(f"{op}: dims {list(order)} is not a permutation of {info.ndim} dims")
            return [TensorInfo(info.dtype, tuple(info.shape[d] for d in norm))]

        return self._apply(Record("op", op, (ref,), (("dims", order),), self._out("T")), infer)

    def squeeze(self, arg, dims, squeeze_expanded=False):
        op = "squeeze"
        ref = self._tensor(arg, op)
        sq = tuple(dims) if isinstance(dims, (list, tuple)) else (dims,)

        def infer() -> list:
            info = self._info(ref)
            norm = shapes.normalize_dims(sq, info.ndim, op)
            for d in norm:
                if info.shape[d] not in (1, shapes.SYMBOLIC):
                    raise ValueError(f"{op}: dim {d} has size {info.shape[d]}, only size-1 dims squeeze")
            return [TensorInfo(info.dtype, tuple(e for i, e in enumerate(info.shape) if i not in norm))]

        return self._apply(Record("op", op, (ref,), (("dims", sq),), self._out("T")), infer)

    def stride_order(self, arg, stride_order):
        """The same values, laid out in memory in `stride_order` (stride_order[i] is dim i's
        rank by stride, 0 innermost) where the result is a fusion output; no copy of its own
        elsewhere (Note [Output layouts] in fusion_cache/ir/output_layout.py)."""
        op = "stride_order"
        ref = self._tensor(arg, op)
        if not isinstance(stride_order, (list, tuple)):
            raise TypeError(f"{op}: stride_order must be a list of ints, got {stride_order!r}")
        order = tuple(stride_order)

        def infer() -> list:
            info = self._info(ref)
            if len(order) != info.ndim:
                raise ValueError("Operator stride_order expects `stride_order` argument to have "
                                 f"the same length as input! (got {list(order)} for rank "
                                 f"{info.ndim})")  # fmt: skip
            shapes.normalize_dims(order, info.ndim, op, "stride_order")  # a permutation
            return [TensorInfo(info.dtype, info.shape)]

        record = Record("op", op, (ref,), (("stride_order", order),), self._out("T"))
        return self._apply(record, infer)

    def size(self, arg, dim):
        op = "size"
        ref = self._tensor(arg, op)

        def infer() -> list:
            shapes.normalize_dim(dim, self._info(ref).ndim, op)
            return [ScalarInfo(DataType.Int)]

        return self._apply(Record("op", op, (ref,), (("dim", dim),), self._out("S")), infer)

    def shape(self, arg):
        op = "shape"
        ref = self._tensor(arg, op)

        def infer() -> list:
            return [VectorInfo(DataType.Int, (None,) * self._info(ref).ndim)]

        return self._apply(Record("op", op, (ref,), (), self._out("V")), infer)


def _target_sizes(op: str, target: list) -> list:
    """A shape argument's sizes: -1 keeps the input's size, anything else below 0 is wrong."""
    for d, t in enumerate(target):
        if t is not None and t < -1:
            raise ValueError(f"{op}: shape[{d}] = {t} is not a size (-1 keeps the input's size)")
    return target
