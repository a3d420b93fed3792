"""The `fd.ops` namespace: each method checks its arguments, builds a record and infers
the dtype and shape of what it creates (raising TypeError/ValueError naming the argument)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fusion_cache.frontend import shapes

from ..dtypes import DataType, check_dtype, is_complex, is_float, is_integral, promote
from ..records import Record, Ref
from ..values import ScalarInfo, Tensor, TensorInfo, Vector, VectorInfo, _Handle
from .table import OPS

if TYPE_CHECKING:
    from ..definition import FusionDefinition

_NUMBER = (bool, int, float, complex)


class Operators:
    """Bound to one FusionDefinition as `fd.ops`."""

    def __init__(self, fd: FusionDefinition) -> None:
        self._fd = fd

    # ---- argument helpers -------------------------------------------------------------

    def _ref(self, value: Any, op: str, arg: str, kinds: str = "TS") -> Ref:
        """A state of this definition; Python numbers become constants."""
        fd = self._fd
        if isinstance(value, _Handle):
            if value.fd is not fd:
                raise ValueError(
                    f"{op}: argument '{arg}' ({value.ref}) belongs to another FusionDefinition"
                )
            if value.ref.kind not in kinds:
                want = {"T": "a tensor", "S": "a scalar", "V": "a vector"}
                raise TypeError(
                    f"{op}: argument '{arg}' must be {' or '.join(want[k] for k in kinds)}, "
                    f"got {value.ref}"
                )
            return value.ref
        if isinstance(value, _NUMBER) and "S" in kinds:
            return fd.define_scalar(value).ref
        raise TypeError(
            f"{op}: argument '{arg}' must be a value of this definition"
            f"{' or a Python number' if 'S' in kinds else ''}, got {type(value).__name__}"
        )

    def _tensor(self, value: Any, op: str, arg: str = "arg") -> Ref:
        return self._ref(value, op, arg, "T")

    def _info(self, ref: Ref):
        return self._fd._infos[ref.index]

    def _apply(self, record: Record, infer: Callable[[], list]) -> Any:
        return self._fd._apply(record, infer)

    def _out(self, kinds: str) -> tuple[Ref, ...]:
        return self._fd._next_refs(kinds)

    def _size_list(self, value: Any, op: str, arg: str) -> Any:
        """A shape argument: a Vector, or a list of ints and Int scalars."""
        if isinstance(value, Vector):
            return self._ref(value, op, arg, "V")
        if isinstance(value, (list, tuple)) or type(value).__name__ == "Size":
            items = []
            for i, v in enumerate(value):
                if isinstance(v, _Handle):
                    ref = self._ref(v, op, f"{arg}[{i}]", "S")
                    items.append(ref)
                elif isinstance(v, int) and not isinstance(v, bool):
                    items.append(v)
                else:
                    raise TypeError(f"{op}: {arg}[{i}] must be an int or Int scalar, got {v!r}")
            return tuple(items)
        raise TypeError(f"{op}: {arg} must be a list of sizes or a Vector, got {value!r}")

    def _static_sizes(self, sizes: Any) -> list[int | None]:
        """The sizes a shape argument pins at definition time (None: known at execute)."""
        fd = self._fd
        if isinstance(sizes, Ref):
            return [self._const_int(e) for e in fd._infos[sizes.index].elements]
        return [self._const_int(e) for e in sizes]

    def _const_int(self, e: Any) -> int | None:
        if isinstance(e, Ref):
            info = self._fd._infos[e.index]
            return info.value if isinstance(info, ScalarInfo) and info.is_const else None
        return e

    # ---- elementwise ------------------------------------------------------------------

    def _elementwise(self, name: str, *operands: Any) -> Any:
        spec = OPS[name]
        argnames = ("arg", "other", "third", "fourth")
        refs = tuple(self._ref(v, name, argnames[i]) for i, v in enumerate(operands))

        def infer() -> list:
            infos = [self._info(r) for r in refs]
            tensors = [i for i in infos if isinstance(i, TensorInfo)]
            dtype = spec.result(promoted_dtype(spec, infos))
            if name == "where" and infos[0].dtype is not DataType.Bool:
                raise TypeError(f"where: condition must be Bool, got {infos[0].dtype!r}")
            if not tensors:
                return [ScalarInfo(dtype)]
            return [TensorInfo(dtype, shapes.broadcast_shapes(name, [t.shape for t in tensors]))]

        kind = "T" if any(r.kind == "T" for r in refs) else "S"
        return self._apply(Record("op", name, refs, (), self._out(kind)), infer)

    # ---- reductions -------------------------------------------------------------------

    def _reduction(self, name: str, arg: Any, dims: Any, keepdim: bool, dtype: Any) -> Tensor:
        ref = self._tensor(arg, name)
        dtype = check_dtype(dtype, f"{name}: dtype") if dtype is not None else DataType.Null
        if dims is None:
            dims = list(range(self._info(ref).ndim))
        dims = tuple(dims) if isinstance(dims, (list, tuple)) else dims
        kwargs = (("dims", dims), ("keepdim", bool(keepdim)), ("dtype", dtype))

        def infer() -> list:
            info = self._info(ref)
            axes = shapes.normalize_dims(dims, info.ndim, name)
            if dtype is not DataType.Null:
                out = dtype
            elif name in ("sum", "prod") and is_integral(info.dtype):
                out = DataType.Int
            else:
                out = info.dtype
            return [TensorInfo(out, _reduced(info.shape, axes, keepdim))]

        return self._apply(Record("op", name, (ref,), kwargs, self._out("T")), infer)

    def sum(self, arg, dims=None, keepdim=False, dtype=DataType.Null, *, axes=None):
        return self._reduction("sum", arg, axes if dims is None else dims, keepdim, dtype)

    def prod(self, arg, dims=None, keepdim=False, dtype=DataType.Null, *, axes=None):
        return self._reduction("prod", arg, axes if dims is None else dims, keepdim, dtype)

    def max(self, arg, dims=None, keepdim=False, dtype=DataType.Null, *, axes=None):
        return self._reduction("max", arg, axes if dims is None else dims, keepdim, dtype)

    def min(self, arg, dims=None, keepdim=False, dtype=DataType.Null, *, axes=None):
        return self._reduction("min", arg, axes if dims is None else dims, keepdim, dtype)

    def _stats(self, name: str, arg: Any, dims: Any, kwargs: tuple, outs: int) -> Any:
        ref = self._tensor(arg, name)
        dims = tuple(dims) if isinstance(dims, (list, tuple)) else dims
        keepdim = dict(kwargs).get("keepdim", False)

        def infer() -> list:
            info = self._info(ref)
            if not (is_float(info.dtype) or is_complex(info.dtype)):
                raise TypeError(f"{name}: arg must be a floating-point tensor, got {info.dtype!r}")
            axes = shapes.normalize_dims(dims, info.ndim, name)
            shape = _reduced(info.shape, axes, keepdim)
            result = [TensorInfo(info.dtype, shape) for _ in range(outs)]
            if name == "welford":
                result[2] = TensorInfo(DataType.Int, shape)
            return result

        record = Record("op", name, (ref,), (("dims", dims),) + kwargs, self._out("T" * outs))
        return self._apply(record, infer)

    def var(self, arg, dims, correction=1, keepdim=False, *, axes=None):
        kwargs = (("correction", correction), ("keepdim", bool(keepdim)))
        return self._stats("var", arg, dims if axes is None else axes, kwargs, 1)

    def var_mean(self, arg, dims, correction=1, keepdim=False, *, axes=None):
        kwargs = (("correction", correction), ("keepdim", bool(keepdim)))
        return self._stats("var_mean", arg, dims if axes is None else axes, kwargs, 2)

    def welford(self, arg, dims=None, *, axes=None):
        return self._stats("welford", arg, dims if axes is None else axes, (), 3)

    def batch_norm(self, arg, weight, bias, running_mean, running_var, momentum, eps,
                   training, channels_last=False):  # fmt: skip
        op = "batch_norm"
        x = self._tensor(arg, op)
        optional = []
        for name, v in (("weight", weight), ("bias", bias), ("running_mean", running_mean),
                        ("running_var", running_var)):  # fmt: skip
            optional.append(None if v is None else self._tensor(v, op, name))
        mom = self._ref(momentum, op, "momentum", "S")
        ep = self._ref(eps, op, "eps", "S")
        if isinstance(training, _Handle):
            train: Any = self._ref(training, op, "training", "S")
        elif isinstance(training, bool):
            train = training
        else:
            raise TypeError(f"{op}: training must be a bool or Bool scalar, got {training!r}")
        args = (x, *optional, mom, ep)
        kwargs = (("training", train), ("channels_last", bool(channels_last)))

        def infer() -> list:
            info = self._info(x)
            if info.ndim < 2:
                raise ValueError(f"{op}: arg must have at least 2 dims, got {info.ndim}")
            if not is_float(info.dtype):
                raise TypeError(f"{op}: arg must be floating point, got {info.dtype!r}")
            c = info.shape[-1] if channels_last else info.shape[1]
            for name, r in zip(("weight", "bias", "running_mean", "running_var"), optional):
                if r is None:
                    continue
                t = self._info(r)
                if t.ndim != 1:
                    raise ValueError(f"{op}: {name} must be 1-D, got rank {t.ndim}")
                shapes.broadcast_shapes(f"{op} ({name} vs channels)", [(c,), t.shape])
            stat = DataType.Float if info.dtype in (DataType.Half, DataType.BFloat16) else info.dtype
            return [TensorInfo(info.dtype, info.shape), TensorInfo(stat, (c,)),
                    TensorInfo(stat, (c,))]  # fmt: skip

        return self._apply(Record("op", op, args, kwargs, self._out("TTT")), infer)

    # ---- shape ops --------------------------------------------------------------------

    def broadcast(self, arg, is_broadcast_dim):
        op = "broadcast"
        ref = self._tensor(arg, op)
        flags = tuple(bool(b) for b in is_broadcast_dim)

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
        bdims = tuple(broadcast_dims)

        def infer() -> list:
            info = self._info(ref)
            target = self._static_sizes(sizes)
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
            target = self._static_sizes(sizes)
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
                else:
                    out.append(shapes.broadcast_shapes(op, [(c,) for c in col])[0])
            dtype = promote(tuple((2, t.dtype) for t in infos))
            return [TensorInfo(dtype, tuple(out))]

        return self._apply(Record("op", op, (refs,), (("dim", dim),), self._out("T")), infer)

    def cast(self, arg, dtype):
        op = "cast"
        ref = self._ref(arg, op, "arg")
        dt = check_dtype(dtype, f"{op}: dtype")

        def infer() -> list:
            info = self._info(ref)
            if isinstance(info, TensorInfo):
                return [TensorInfo(dt, info.shape)]
            return [ScalarInfo(dt)]

        return self._apply(Record("op", op, (ref,), (("dtype", dt),), self._out(ref.kind)), infer)

    def full(self, shape, fill_value, dtype):
        op = "full"
        sizes = self._size_list(shape, op, "shape")
        fill = self._ref(fill_value, op, "fill_value", "S")
        dt = check_dtype(dtype, f"{op}: dtype")

        def infer() -> list:
            target = self._static_sizes(sizes)
            if any(t is not None and t < 0 for t in target):
                raise ValueError(f"{op}: shape {target} has a negative size")
            return [TensorInfo(dt, tuple(shapes.SYMBOLIC if t is None else t for t in target))]

        kwargs = (("shape", sizes), ("fill_value", fill), ("dtype", dt))
        return self._apply(Record("op", op, (), kwargs, self._out("T")), infer)

    def iota(self, length, start=None, step=None, dtype=DataType.Int):
        op = "iota"
        dt = check_dtype(dtype, f"{op}: dtype")
        n = self._ref(length, op, "length", "S")
        a = self._ref(0 if start is None else start, op, "start", "S")
        b = self._ref(1 if step is None else step, op, "step", "S")

        def infer() -> list:
            const = self._const_int(n)
            if const is not None and const < 0:
                raise ValueError(f"{op}: length must be >= 0, got {const}")
            return [TensorInfo(dt, (shapes.SYMBOLIC if const is None else const,))]

        return self._apply(Record("op", op, (n, a, b), (("dtype", dt),), self._out("T")), infer)

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


def promoted_dtype(spec, infos: Sequence) -> DataType:
    """The dtype an elementwise op computes in, by torch's rules (Note [Promotion])."""
    classes = []
    for idx in spec.promote_args:
        info = infos[idx]
        cls = 0 if isinstance(info, ScalarInfo) else (2 if info.ndim else 1)
        classes.append((cls, info.dtype))
    return promote(tuple(classes))


def _reduced(shape: tuple[int, ...], axes: Sequence[int], keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if i in axes else e for i, e in enumerate(shape))
    return tuple(e for i, e in enumerate(shape) if i not in axes)


def _install_elementwise() -> None:
    for name, spec in OPS.items():
        def method(self, *args, _name=name, _arity=spec.arity, **kwargs):
            if kwargs:
                names = ("arg", "other", "third", "fourth")[: _arity]
                extra = [k for k in kwargs if k not in names and k not in ("alpha", "value")]
                if extra:
                    raise TypeError(f"{_name}: unexpected keyword argument '{extra[0]}'")
                args = args + tuple(kwargs.values())
            if len(args) != _arity:
                raise TypeError(f"{_name} takes {_arity} arguments, got {len(args)}")
            return self._elementwise(_name, *args)

        method.__name__ = name
        setattr(Operators, name, method)


_install_elementwise()
