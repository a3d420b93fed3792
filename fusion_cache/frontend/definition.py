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
from .run_options import PLAIN, ExecuteOptions
from .trie import FusionCache, TrieNode
from .values import HANDLE_TYPES, ScalarInfo, Tensor, TensorInfo, VectorInfo, _Handle


class FusionDefinitionError(ValueError, RuntimeError):
    """Misuse of a definition's lifecycle (ops after closing, executing an undefined fusion).
    Also a RuntimeError: nvFuser raises that, and clients catch it."""


class UndefinedFusionError(FusionDefinitionError, NotImplementedError):
    """Executing or inspecting a FusionDefinition that was never defined; nvFuser raises
    NotImplementedError there (its definition() is not implemented)."""


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
        self._last_report: Any = None  # RunReport of the last execute that asked for one
        self._profiled = False
        self.last_input_reproducers: list | None = None
        self._user_schedule = _user_schedule_of(type(self))
        self._counted = True  # a user's fusion (FusionCache.num_fusions), not a segment's
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
        self._fid = self._cache.finalize(node, records, lambda: python_definition(records, None),
                                         counted=self._counted)  # fmt: skip
        self._state = _CLOSED
        from .options import dump_enabled

        if dump_enabled("python_definition"):
            print(repr(self))

    def _check_open(self) -> None:
        if self._state != _OPEN:
            what = "closed" if self._state == _CLOSED else "not open"
            raise FusionDefinitionError(
                ("Attempting to add to a completed definition! " if what == "closed" else "")
                + f"This FusionDefinition is {what}: add definitions and ops inside "
                "`with FusionDefinition() as fd:` (or in definition())"
            )

    def _ensure_defined(self) -> None:
        if self._state == _CLOSED:
            return
        if self._state in (_NEW, _FAILED) and type(self) is not FusionDefinition:
            # a subclass defines itself on first use; one whose definition() failed tries
            # again, and one without definition() says so, as nvFuser does
            with self:
                self.definition()
            return
        raise UndefinedFusionError(
            "Invalid fusion definition! This FusionDefinition has no complete definition yet: "
            "define it in a `with` block, implement definition(), or bind an id with "
            "FusionDefinition(fid)"
        )

    def definition(self) -> None:
        """Subclasses override this to define their fusion."""
        raise NotImplementedError("definition() should be implemented by child class!")

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
        from .tensor_forms import canonical_tensor, logical_contiguity

        shape, contiguity, dtype, is_cpu, stride_order = canonical_tensor(args, kwargs)
        record = Record(
            "tensor",
            kwargs=(("shape", shape), ("contiguity", contiguity), ("dtype", dtype),
                    ("is_cpu", is_cpu), ("stride_order", stride_order)),  # fmt: skip
            outputs=self._next_refs("T"),
        )
        info = TensorInfo(dtype, shape, logical_contiguity(contiguity, stride_order), stride_order,
                          is_cpu, is_input=True)  # fmt: skip
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
        """Mark `output` as a result. `alias_input=t`: write it into input `t` in place
        instead (nothing is returned for it). `stride_order=[...]` (also the second
        positional argument, as in nvFuser): return it laid out in that memory order."""
        if isinstance(alias_input, (list, tuple)):  # add_output(t, [2, 0, 1])
            if stride_order is not None:
                raise TypeError("add_output: stride_order given twice")
            alias_input, stride_order = None, alias_input
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
            if len(order) != rank:
                raise ValueError("add_output: stride_order needs to be either empty or the same "
                                 f"length of Tensor `output` (got {list(order)}, rank {rank})")  # fmt: skip
            if any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < rank for v in order):
                raise ValueError(f"add_output: stride_order elements need to be within [0, {rank}) "
                                 f"(got {list(order)})")  # fmt: skip
            if len(set(order)) != rank:
                raise ValueError(f"add_output: duplicated elements in stride_order detected! "
                                 f"(got {list(order)})")  # fmt: skip
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

    def extents(self) -> list[int]:
        """Ids for the extents of the input tensors, one a dim in input order, numbered
        after the definition's states: with inputs() they index a run's arguments and
        their sizes, as in nvFuser (`inputs() + extents()` ~ `args + sizes`)."""
        base = len(self._infos)
        ids = []
        for ref in self.input_refs():
            if ref.kind == "T":
                ids.extend(range(base + len(ids), base + len(ids) + self._infos[ref.index].ndim))
        return ids

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
                print_repro: bool = False, profile: bool = False, save_repro_inputs: bool = False,
                _enable_options: Sequence[str] | None = (),
                _disable_options: Sequence[str] | None = ()) -> list[torch.Tensor]:  # fmt: skip
        """Run the fusion on `inputs` (tensors and Python scalars, in definition order).

        device: the CUDA device (index, 'cuda:N' or torch.device) to run on; needed only when
        no input tensor says it. capture_debug_output: keep what the run prints (the
        FUSION_CACHE_DUMP knobs) for `debug_output()`. profile: time each kernel with CUDA
        events for `profile()`. print_repro: print `repro_script_for(inputs)`.
        save_repro_inputs: keep the inputs' layouts for `last_repro_script()`.
        override_user_schedule: run a definition whose class defines `schedule()` (which is
        refused otherwise) with the automatic schedule. _enable_options/_disable_options:
        nvFuser's option names (Note [Run options] in run_options.py)."""
        if self._state != _CLOSED:
            self._ensure_defined()
        if not (device is not None or capture_debug_output or profile or _enable_options
                or _disable_options or save_repro_inputs or print_repro or self._user_schedule):
            self._last_report = None
            self._profiled = False
            return engine().execute(self, inputs, PLAIN)
        if self._user_schedule and not override_user_schedule:
            raise FusionDefinitionError(
                f"{type(self).__name__} defines {self._user_schedule}(): fusion-cache schedules "
                "every fusion itself and runs no user schedule; remove it, or pass "
                "execute(..., override_user_schedule=True) to run the automatic schedule"
            )
        if save_repro_inputs:
            from .repro import InputReproducer

            self.last_input_reproducers = [InputReproducer(v) for v in inputs]
        if print_repro:
            print(self.repro_script_for(inputs))
        options = ExecuteOptions.build(device, capture_debug_output, profile, _enable_options,
                                       _disable_options)  # fmt: skip
        self._profiled = options.profile
        self._last_report = options.report
        return engine().execute(self, inputs, options)

    def debug_output(self) -> str | None:
        """What the last execute printed, if it passed capture_debug_output=True; else None."""
        report = self._last_report
        return None if report is None else report.debug_output

    def profile(self) -> Any:
        """The FusionProfile of the last execute, which must have passed profile=True: per
        kernel its name, scheduler, time from CUDA events, bytes moved and bandwidth."""
        if not self._profiled or self._last_report is None or self._last_report.profile is None:
            raise ValueError(
                "The execute() method was not previously called with profiling enabled!"
            )
        return self._last_report.profile

    def repro_script_for(self, inputs: Sequence[Any] | None = None) -> str:
        """A runnable script: this definition, and inputs of the same shapes, strides,
        dtypes and devices as `inputs` (random values in their range)."""
        from .repro import repro_script

        self._ensure_defined()
        return repro_script(self, inputs)

    def last_repro_script(self) -> str:
        if self.last_input_reproducers is None:
            raise FusionDefinitionError(
                "last_repro_script() needs a previous execute(inputs, save_repro_inputs=True)"
            )
        return self.repro_script_for(self.last_input_reproducers)

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

    def scheduled_fusion_ir_for(self, inputs: Sequence[Any], tensor_transforms: bool = False,
                                target: Any = None, **kwargs: Any) -> str:  # fmt: skip
        """The scheduled Fusion IR (scheduler, plan, kernels) for these inputs, planned and
        compiled without running (meta or CPU tensors may stand in for CUDA ones; `target`
        a GPU profile such as 'h100', default the current GPU, else h100)."""
        if target is None and not torch.cuda.is_available():
            target = "h100"
        self.precompile(inputs, target)
        return engine().last_scheduled_fusion_ir(self)

    def validate(self, inputs: Sequence[Any], reference_outputs: Sequence[Any] | None = None,
                 **kwargs: Any) -> None:  # fmt: skip
        """Execute on `inputs` and check the outputs against `reference_outputs` (default: the
        reference evaluator on CPU copies), with tolerances by dtype, widened by the
        square root of the largest reduction's size; raises AssertionError on a mismatch."""
        from .tolerances import check_outputs

        clones = [v.clone() if isinstance(v, torch.Tensor) else v for v in inputs]
        outputs = self.execute(inputs, **kwargs)
        if reference_outputs is None:
            cpu = [v.cpu() if isinstance(v, torch.Tensor) else v for v in clones]
            reference_outputs = self.execute(cpu)
        check_outputs(self, list(outputs), list(reference_outputs), inputs)


def _user_schedule_of(cls: type) -> str | None:
    """The name of a user schedule a FusionDefinition subclass defines, if any."""
    for name in ("schedule", "multidevice_schedule"):
        if callable(getattr(cls, name, None)):
            return name
    return None


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
