"""Launch plans: what a run of one fusion needs for inputs of one signature, and that
signature (Note [Plan cache] in executor.py)."""
from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from fusion_cache.frontend.dtypes import to_torch
from schedulers.base import ArgRef, LaunchSpec

from .kernel_cache import KernelRef

_graph_runs = threading.local()


# torch.cuda.is_current_stream_capturing's C function, without its Python frame
_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or (lambda: False)


def _unkept() -> bool:
    """Whether plans must not keep the buffers a run takes (Note [Scratch per stream])."""
    return getattr(_graph_runs, "on", False) or _capturing()


@contextmanager
def unkept_buffers() -> Iterator[None]:
    """Runs whose allocations land in a CUDA graph's pool (cudagraph trees' warm-up and
    capture): plans hand them fresh scratch and barrier counters and keep none."""
    before = getattr(_graph_runs, "on", False)
    _graph_runs.on = True
    try:
        yield
    finally:
        _graph_runs.on = before


@dataclass(frozen=True)
class ReferencePlan:
    """Inputs of this signature run on the reference evaluator, for `reason`."""

    reason: str


@dataclass
class LaunchPlan:
    spec: LaunchSpec
    kernels: list  # LoadedKernel per launch (None when planned ahead without a GPU)
    refs: list[KernelRef]
    slots: list[list[tuple[int, ArgRef]]]  # per launch: (arg slot, what fills it)
    device: Any = None  # the torch.device outputs go to
    fresh: tuple = ()  # (shape, torch dtype, strides or None) of each output to allocate
    host_inputs: tuple = ()  # Note [CPU scalar tensors]: inputs copied to `device` per call
    # Note [Finish in the row kernel]: a cooperative kernel's barrier counters, per stream
    barriers: dict = field(default_factory=dict)
    scratches: dict = field(default_factory=dict)  # Note [Scratch per stream]: stream -> buffers
    # fresh outputs and plain launches only: the cache hit's lean path runs it (launch)
    lean: bool = field(init=False)

    def __post_init__(self) -> None:
        spec = self.spec
        self.lean = not spec.workspaces and all(o.alias_input is None for o in spec.outputs) and not any(
            k.cooperative or k.dependent for k in spec.kernels)  # fmt: skip

    def barrier(self) -> torch.Tensor:
        """The zeroed counters of a grid barrier for the current stream: launches on one
        stream run one after another and each leaves them zeroed; streams get their own.
        A launch captured into a CUDA graph gets counters of its own from the graph's pool:
        their zeroing is captured too, so every replay starts from zero whatever ran in that
        memory since, and the plan keeps no tensor of the pool (see scratch below)."""
        if _unkept():
            return torch.zeros(2, dtype=torch.int32, device=self.device)
        from codegen.launch import current_raw_stream

        stream = current_raw_stream(self.device.index)
        counters = self.barriers.get(stream)
        if counters is None:
            counters = self.barriers[stream] = torch.zeros(2, dtype=torch.int32, device=self.device)
        return counters


    def scratch(self) -> tuple[torch.Tensor, ...]:
        """The spec's workspaces for a run on the current stream.

        Note [Scratch per stream]: a plan's scratch (a split reduction's partials) is written
        in full before it is read and dead once its kernels end, so runs on one stream, which
        follow one another, share one set, allocated on the stream's first run and kept with
        the plan, as the barrier counters are; a cache hit allocates only its outputs (each
        buffer cost about 2.5 us of host time a run). Streams get their own set. A launch
        captured into a CUDA graph gets a fresh set that the plan does not keep: the graph's
        memory pool holds it for the replays, and cudagraph trees refuse a tensor of their pool
        that outlives the capture without being one of its outputs (the H100 run of
        tests/gpu/test_models_gpu.py: "4 tensor(s) in the cudagraph pool not tracked"). So
        do the runs cudagraph trees warm up in their pool before capturing: the CUDA-graph
        mode runs its graphs under unkept_buffers()."""
        device = self.device
        if device.type != "cuda":
            key = None
        elif _unkept():
            return self._new_scratch()
        else:
            from codegen.launch import current_raw_stream

            key = current_raw_stream(device.index)
        found = self.scratches.get(key)
        if found is None:
            found = self.scratches[key] = self._new_scratch()
        return found

    def _new_scratch(self) -> tuple[torch.Tensor, ...]:
        """Fresh workspaces, each filled with its value in spec.workspace_fills where it has
        one (Note [Kept words]: the plan's kernels leave it so at the end of every run)."""
        fills = self.spec.workspace_fills or (None,) * len(self.spec.workspaces)
        return tuple(torch.empty(n, dtype=to_torch(dt), device=self.device) if fill is None
                     else torch.full((n,), fill, dtype=to_torch(dt), device=self.device)
                     for (n, dt), fill in zip(self.spec.workspaces, fills))  # fmt: skip


def _alignment(ptr: int) -> int:
    return 16 if ptr % 16 == 0 else (ptr & -ptr if ptr else 16)


def input_key(values: Sequence[Any]) -> tuple:
    key = []
    for v in values:
        if isinstance(v, torch.Tensor):
            ptr = v.data_ptr()
            align = 16 if ptr & 15 == 0 else _alignment(ptr)
            key.append((v.dtype, v.shape, v.stride(), align, v.get_device()))
        elif type(v) is int:
            key.append(v)  # ints may size tensors
        elif isinstance(v, (list, tuple)):
            key.append(tuple(v))  # a vector input: its values may size tensors too
        else:
            key.append(type(v))
    return tuple(key)


def fill_args(template: tuple, slots: list, values: Sequence[Any], outs: list,
               work: Sequence[torch.Tensor]) -> list:  # fmt: skip
    """A launch's arguments: the plan's template with this run's pointers and scalars."""
    args = list(template)
    for slot, ref in slots:
        kind = ref.kind
        if kind == "input":
            args[slot] = values[ref.index].data_ptr()
        elif kind == "output":
            args[slot] = outs[ref.index].data_ptr()
        elif kind == "workspace":
            args[slot] = work[ref.index].data_ptr()
        else:
            args[slot] = values[ref.index]
    return args


def host_inputs_of(values: Sequence[Any]) -> tuple[int, ...]:
    """Note [CPU scalar tensors]: a 0-dim CPU tensor (define_tensor(is_cpu=True)) may come with
    CUDA inputs, as in nvFuser; a kernel cannot read host memory, so each call copies it to
    the GPU first (a few bytes, stream-ordered). Any other CPU tensor beside CUDA ones is an
    error that names it."""
    host = []
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor) and not v.is_cuda:
            if v.dim() != 0:
                raise ValueError(f"input {i} is a {v.dim()}-dim tensor on {v.device} while other inputs "
                                 "are on the GPU; only 0-dim CPU tensors (scalars) may stay on the CPU")  # fmt: skip
            host.append(i)
    return tuple(host)
