"""FusionDefinition: nvFuser's Python frontend, recorded into the FusionCache trie."""
from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch

from .dtypes import DataType, check_dtype, from_torch, is_complex, is_float, scalar_dtype_of
from .engine import engine
from .layout import is_default_stride_order
from .ops import Operators
from .printer import python_definition
from .records import END, Record, Ref
from .trie import FusionCache, TrieNode
from .values import HANDLE_TYPES, ScalarInfo, Tensor, TensorInfo, VectorInfo, _Handle


class FusionDefinitionError(ValueError):
    """Misuse of a definition's lifecycle (ops after closing, executing an undefined fusion)."""


_OPEN, _CLOSED, _NEW, _FAILED = "open", "closed", "new", "failed"


def _coerce_scalar(value: Any, dtype: DataType, what: str) -> Any:
    """A constant in its dtype's Python type, so 1 and 1.0 as Double are one record."""
    if dtype is DataType.Bool:
        if not isinstance(value, (bool, int)) or value not in (0, 1):
            raise TypeError(f"{what}: {value!r} is not a Bool")
        return bool(value)
    if dtype in (DataType.Int, DataType.Int32, DataType.UInt64):
        if isinstance(value, float) and not value.is_integer() or isinstance(value, complex):
            raise TypeError(f"{what}: {value!r} is not an integer for dtype {dtype!r}")
        if dtype is DataType.UInt64 and not 0 <= int(value) < 2**64:
            raise TypeError(f"{what}: {value!r} is out of range for dtype {dtype!r}")
        return int(value)
    if is_float(dtype):
        if isinstance(value, complex):
            raise TypeError(f"{what}: complex {value!r} for dtype {dtype!r}")
        return float(value)
    if is_complex(dtype):
        return complex(value)
    raise TypeError(f"{what}: dtype {dtype!r} is not a scalar dtype")


class FusionDefinition:
    """Define a fusion with `with FusionDefinition() as fd:`, or subclass and implement
    `definition(self)`, or bind an existing fusion with `FusionDefinition(fid)`."""

    def __init__(self, id: Any = None, max_length: int = 1024) -> None:
        self._cache = FusionCache.get()
        self._max_length = max_length
        self._records: list[Record] = []
        self._infos: list = []
        self._state = _NEW
        self._fid: int | None = None
        self._cursor: TrieNode = self._cache.root
        self._lock = threading.Lock()
        self.ops = Operators(self)
        self.segments: list[FusionDefinition] = []
        self.segment_index_space_maps: dict = {}
        self._last_run: Any = None
        if isinstance(id, Fusion):
            id._fd = self
        elif id is not None:
            if isinstance(id, bool) or not isinstance(id, int):
                raise TypeError(f"FusionDefinition: id must be an int fusion id, got {id!r}")
            self._replay(self._cache.records_for(id))

    # ---- lifecycle ----------------------------------------------------------------------

    def __enter__(self) -> FusionDefinition:
        self._setup_definition()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._state = _FAILED
            return
        self._finalize_definition()

    def _setup_definition(self) -> None:
        if self._state == _OPEN:
            raise FusionDefinitionError("this FusionDefinition is already being defined")
        self._records, self._infos = [], []
        self._cursor = self._cache.root
        self._fid = None
        self._state = _OPEN

    def _finalize_definition(self) -> None:
        node = self._cache.step(self._cursor, END)
        records = tuple(self._records)
        self._fid = self._cache.finalize(node, records, lambda: python_definition(records, None))
        self._state = _CLOSED
        from .options import dump_enabled

        if dump_enabled("python_definition"):
            print(repr(self))

    def _check_open(self) -> None:
        if self._state != _OPEN:
            what = "closed" if self._state == _CLOSED else "not open"
            raise FusionDefinitionError(
                f"this FusionDefinition is {what}: add definitions and ops inside "
                "`with FusionDefinition() as fd:` (or in definition())"
            )

    def _ensure_defined(self) -> None:
        if self._state == _CLOSED:
            return
        if self._state == _NEW and type(self).definition is not FusionDefinition.definition:
            with self:
                self.definition()
            return
        raise FusionDefinitionError(
            "this FusionDefinition has no complete definition yet: define it in a "
            "`with` block, implement definition(), or bind an id with FusionDefinition(fid)"
        )

    def definition(self) -> None:
        """Subclasses override this to define their fusion."""
        raise NotImplementedError

    def _replay(self, records: Sequence[Record]) -> None:
        from .replay import replay_records

        with self:
            replay_records(self, records)

    # ---- the record path ------------------------------------------------------------------

    def _next_refs(self, kinds: str) -> tuple[Ref, ...]:
        base = len(self._infos)
        return tuple(Ref(k, base + i) for i, k in enumerate(kinds))

    def _advance(self, record: Record) -> TrieNode | None:
        """The trie node after `record`; a record that failed before fails again at once."""
        node = self._cache.step(self._cursor, record)
        if node.error is not None:
            raise node.error[0](node.error[1])
        return node

    def _apply(self, record: Record, infer) -> Any:
        self._check_open()
        if len(self._records) >= self._max_length:
            raise ValueError(f"the definition is longer than max_length={self._max_length} records")
        node = self._advance(record)
        try:
            infos = infer()
        except (TypeError, ValueError) as err:
            if node is not None:
                self._cache.set_error(node, err)
            raise
        if node is not None:
            self._cursor = node
        self._records.append(record)
        self._infos.extend(infos)
        handles = [HANDLE_TYPES[r.kind](self, r) for r in record.outputs]
        if not handles:
            return None
        return handles[0] if len(handles) == 1 else tuple(handles)

    # ---- inputs ---------------------------------------------------------------------------

    def define_tensor(self, *args: Any, **kwargs: Any) -> Tensor:
        from .tensor_forms import canonical_tensor

        shape, contiguity, dtype, is_cpu, stride_order = canonical_tensor(args, kwargs)
        record = Record(
            "tensor",
            kwargs=(("shape", shape), ("contiguity", contiguity), ("dtype", dtype),
                    ("is_cpu", is_cpu), ("stride_order", stride_order)),  # fmt: skip
            outputs=self._next_refs("T"),
        )
        info = TensorInfo(dtype, shape, contiguity, stride_order, is_cpu, is_input=True)
        return self._apply(record, lambda: [info])

    def from_pytorch(self, tensor: torch.Tensor, static_sizes: bool = False) -> Tensor:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"from_pytorch: tensor must be a torch.Tensor, got {type(tensor).__name__}")
        return self.define_tensor(
            sizes=list(tensor.shape), strides=list(tensor.stride()),
            dtype=from_torch(tensor.dtype), static_sizes=static_sizes,
            is_cpu=tensor.device.type == "cpu" and tensor.dim() == 0,
        )  # fmt: skip

    def define_scalar(self, value: Any = None, dtype: Any = None) -> Any:
        if isinstance(value, DataType):  # define_scalar(DataType.Half): an input
            value, dtype = None, value
        if value is None:
            dt = check_dtype(DataType.Double if dtype is None else dtype, "define_scalar: dtype")
            kwargs: tuple = (("is_input", True), ("dtype", dt))
            info = ScalarInfo(dt, is_input=True)
        else:
            if isinstance(value, _Handle) or not isinstance(value, (bool, int, float, complex)):
                raise TypeError(f"define_scalar: value must be a Python number, got {value!r}")
            dt = scalar_dtype_of(value) if dtype is None else check_dtype(dtype, "define_scalar: dtype")
            value = _coerce_scalar(value, dt, "define_scalar")
            kwargs = (("value", value), ("dtype", dt))
            info = ScalarInfo(dt, value=value, is_const=True)
        record = Record("scalar", kwargs=kwargs, outputs=self._next_refs("S"))
        return self._apply(record, lambda: [info])

    def define_constant(self, value: Any, dtype: Any = None) -> Any:
        if value is None:
            raise TypeError("define_constant: value is required")
        return self.define_scalar(value, dtype)

    def define_vector(self, arg: Any, dtype: Any = DataType.Int) -> Any:
        dt = check_dtype(dtype, "define_vector: dtype")
        if isinstance(arg, int) and not isinstance(arg, bool):
            if arg < 0:
                raise ValueError(f"define_vector: size must be >= 0, got {arg}")
            kwargs: tuple = (("is_input", True), ("size", arg), ("dtype", dt))
            info = VectorInfo(dt, (None,) * arg, is_input=True)
        elif isinstance(arg, (list, tuple)):
            elems = []
            for i, v in enumerate(arg):
                if isinstance(v, _Handle):
                    elems.append(self.ops._ref(v, "define_vector", f"values[{i}]", "S"))
                elif isinstance(v, int) and not isinstance(v, bool):
                    elems.append(v)
                else:
                    raise TypeError(f"define_vector: values[{i}] must be an int or scalar, got {v!r}")
            kwargs = (("elements", tuple(elems)), ("dtype", dt))
            consts = tuple(self.ops._const_int(e) for e in elems)
            info = VectorInfo(dt, consts)
        else:
            raise TypeError(f"define_vector: expected a size or a list of values, got {arg!r}")
        record = Record("vector", kwargs=kwargs, outputs=self._next_refs("V"))
        return self._apply(record, lambda: [info])

    # ---- outputs --------------------------------------------------------------------------

    def add_output(self, output: Any, alias_input: Any = None, stride_order: Any = None) -> None:
        if not isinstance(output, _Handle):
            raise TypeError(f"add_output: output must be a Tensor or Scalar of this definition, got {output!r}")
        ref = self.ops._ref(output, "add_output", "output", "TS")
        alias = None
        if alias_input is not None:
            alias = self.ops._ref(alias_input, "add_output", "alias_input", "T")
            if not self._infos[alias.index].is_input:
                raise ValueError(f"add_output: alias_input {alias} is not an input of this fusion")
        order = tuple(stride_order) if stride_order else ()
        if order:
            rank = self._infos[ref.index].ndim if ref.kind == "T" else 0
            if sorted(order) != list(range(rank)):
                raise ValueError(f"add_output: stride_order {list(order)} is not a permutation of {rank} dims")
            if is_default_stride_order(order):
                order = ()
        kwargs = (("alias_input", alias), ("stride_order", order))

        def infer() -> list:
            if alias is not None:
                out, dst = self._infos[ref.index], self._infos[alias.index]
                if out.ndim != dst.ndim:
                    raise ValueError(f"add_output: {ref} has rank {out.ndim}, its alias {alias} {dst.ndim}")
            return []

        self._apply(Record("output", args=(ref,), kwargs=kwargs), infer)

    # ---- queries ----------------------------------------------------------------------------

    def id(self) -> int:
        self._ensure_defined()
        return self._fid  # type: ignore[return-value]

    def input_refs(self) -> list[Ref]:
        return [r.outputs[0] for r in self._records if _is_input_record(r)]

    def inputs(self) -> list[int]:
        return [r.index for r in self.input_refs()]

    def output_records(self) -> list[Record]:
        return [r for r in self._records if r.kind == "output"]

    def outputs(self) -> list[int]:
        return [r.args[0].index for r in self.output_records()]

    @property
    def records(self) -> tuple[Record, ...]:
        return tuple(self._records)

    def __repr__(self) -> str:
        if self._state == _NEW and type(self).definition is not FusionDefinition.definition:
            self._ensure_defined()
        return python_definition(self._records, self._fid)

    __str__ = __repr__

    def print(self) -> None:
        print(repr(self))

    def fusion_ir(self) -> str:
        self._ensure_defined()
        return engine().fusion_ir(self)

    def print_ir(self) -> None:
        print(self.fusion_ir())

    # ---- execution --------------------------------------------------------------------------

    def execute(self, inputs: Sequence[Any], *, device: Any = None,
                override_user_schedule: bool = False, capture_debug_output: bool = False,
                print_repro: bool = False, profile: bool = False,
                _enable_options: Sequence[str] = (), _disable_options: Sequence[str] = (),
                ) -> list[torch.Tensor]:  # fmt: skip
        """Run the fusion on `inputs` (tensors and Python scalars, in definition order)."""
        if self._state != _CLOSED:
            self._ensure_defined()
        return engine().execute(self, inputs, device)

    # ---- ahead of time and debugging -------------------------------------------------------

    def precompile(self, inputs: Sequence[Any], target: Any = None) -> list:
        """Compile the kernels `inputs` need (meta/CPU tensors may stand in for CUDA ones)
        for `target` (a profile name such as 'h100', or None for the current GPU)."""
        self._ensure_defined()
        return engine().precompile(self, inputs, target)

    def segment(self, inputs: Sequence[Any], target: Any = None) -> list[FusionDefinition]:
        """The segments' definitions for these inputs (empty when one kernel holds the
        fusion); sets `segments` and `segment_index_space_maps` (per segment: its state
        index -> this definition's). `target` names a GPU profile, as for precompile;
        without one it is the current GPU, or the h100 profile on a machine with none."""
        self._ensure_defined()
        self.segments, self.segment_index_space_maps = engine().segment(self, inputs, target)
        return self.segments

    def last_cuda_code(self, intrinsic_code: bool = False, **kwargs: Any) -> str:
        self._ensure_defined()
        return engine().last_cuda_code(self)

    def cuda_code_for(self, inputs: Sequence[Any], intrinsic_code: bool = False,
                      override_user_schedule: bool = False, target: Any = "h100") -> str:  # fmt: skip
        refs = self.precompile(inputs, target)
        if not refs:
            raise FusionDefinitionError("these inputs need no kernel (empty output)")
        return refs[0].source

    def last_scheduled_fusion_ir(self, tensor_transforms: bool = False, **kwargs: Any) -> str:
        self._ensure_defined()
        return engine().last_scheduled_fusion_ir(self)


def _is_input_record(r: Record) -> bool:
    return r.kind == "tensor" or (r.kind in ("scalar", "vector") and bool(r.kw("is_input")))


class Fusion:
    """The seed-era handle: `fs = Fusion(); with FusionDefinition(fs) as fd: ...; fs.execute(...)`."""

    def __init__(self, fid: int | None = None) -> None:
        self._fd: FusionDefinition | None = None
        if fid is not None:
            self._fd = FusionDefinition(fid)

    def _definition(self) -> FusionDefinition:
        if self._fd is None or self._fd._state != _CLOSED:
            raise FusionDefinitionError("this Fusion is not defined yet: use `with FusionDefinition(fs) as fd:`")
        return self._fd

    def defined(self) -> bool:
        return self._fd is not None and self._fd._state == _CLOSED

    def id(self) -> int:
        return self._definition().id()

    def execute(self, inputs: Sequence[Any], **kwargs: Any) -> list[torch.Tensor]:
        return self._definition().execute(inputs, **kwargs)

    def print(self) -> None:
        self._definition().print_ir()

    def __repr__(self) -> str:
        return repr(self._fd) if self._fd is not None else "Fusion(<undefined>)"
