"""Host time of one torch.compile region call on a cache hit, against its launches alone.

    python -m benchmarks.host_region [--calls 2000] [--rounds 5] [--json FILE]
    python -m benchmarks.host_region --stub   # no GPU: kernels planned for h100, launches stubbed

Each case is a region the backend makes from a small aten graph (make_fx + fuse_graph), at
a tiny size so the GPU waits on the host. Per case, in microseconds a call (back to back,
one synchronize a round, the median of the rounds):

- `region`: the RegionCall replaying its launch sequence (Note [Region call]);
- `launches`: the same kernel launches alone, arguments prepared ahead;
- `overhead`: region - launches, the issue's target being at most 10 us;
- `execute`: fd.execute on the same inputs (the path regions took before);
- `eager`: the aten graph run by torch.

`--stub` runs on the CPU: the plans are made for the h100 profile (NVRTC compiles here), the
kernels are stubs whose launch does nothing, and CPU tensors stand in for CUDA ones. It
adds `python_calls`: the Python functions one region call enters (a stub launch counts one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import operator
import statistics
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from codegen.launch import LaunchSite

# ---- the cases --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegionCase:
    name: str
    fn: Callable[..., Any]
    shapes: tuple[tuple[int, ...], ...]
    dtype: torch.dtype = torch.float32


def _bias_gelu(x, b):
    return F.gelu(x + b, approximate="tanh")


def _residual_layer_norm(x, y, w, b):
    h = x + y
    return h, F.layer_norm(h, [h.shape[-1]], w, b)


def _layer_norm_backward(x, w, b, g):
    x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
    out = F.layer_norm(x, [x.shape[-1]], w, b)
    return torch.autograd.grad(out, (x, w, b), g)


def _softmax_dropout_free(x, m):
    return torch.softmax(x * 0.125 + m, dim=-1)


CASES = (
    RegionCase("bias_gelu", _bias_gelu, ((8, 64), (64,))),
    RegionCase("residual_layer_norm", _residual_layer_norm, ((8, 64), (8, 64), (64,), (64,))),
    RegionCase("softmax_scale_mask", _softmax_dropout_free, ((8, 64), (8, 64))),
    RegionCase("layer_norm_backward", _layer_norm_backward, ((8, 64), (64,), (64,), (8, 64))),
)


def region_of(case: RegionCase, device: str) -> tuple[Any, list[torch.Tensor], Callable]:
    """The case's largest region (a RegionCall), its inputs, and the whole graph as eager."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fusion_cache.frontends import dynamo_backend
    from fusion_cache.frontends.fx_region import RegionCall

    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(s, generator=gen, dtype=case.dtype).to(device) for s in case.shapes]
    gm = make_fx(case.fn)(*inputs)
    eager = make_fx(case.fn)(*inputs)
    dynamo_backend.fuse_graph(gm, "forward")
    calls = [n for n in gm.graph.nodes if isinstance(n.target, RegionCall)]
    if not calls:
        raise RuntimeError(f"{case.name}: no region")
    node = max(calls, key=lambda n: len(n.target.region_graph.graph.nodes))
    # the region's own inputs: run the graph once, keeping the values the call reads
    seen: dict[str, Any] = {}
    interp = torch.fx.Interpreter(gm)
    original = interp.run_node

    def run_node(n):
        value = original(n)
        seen[n.name] = value
        return value

    interp.run_node = run_node
    interp.run(*inputs)
    args = [seen[a.name] if isinstance(a, torch.fx.Node) else a for a in node.args]
    return node.target, args, lambda: eager(*inputs)


# ---- stub launches (--stub, and the CPU tests) ------------------------------------------------


class StubKernel:
    """Stands in for a LoadedKernel: records each launch, runs nothing."""

    def __init__(self, name: str, log: list | None = None) -> None:
        self.name = name
        self.log = log

    def launch(self, grid, block, arg_types, args, shared_mem=0, stream=None, cooperative=False,
               dependent=False) -> None:  # fmt: skip
        if self.log is not None:
            self.log.append((self.name, tuple(grid), tuple(block), shared_mem, cooperative,
                             dependent, tuple(arg_types), list(args)))  # fmt: skip

    def bind(self, grid, block, arg_types, template, pointers, values, shared_mem=0,
             cooperative=False, dependent=False) -> StubLaunch:  # fmt: skip
        return StubLaunch(self, grid, block, arg_types, template, pointers, values, shared_mem,
                          cooperative, dependent)  # fmt: skip

    def max_resident(self, block, shared_mem=0) -> int:
        return 0

    def _recover(self, err, call, grid, block, shared_mem) -> None:  # a stub never fails
        raise RuntimeError(f"{self.name}: stub launch returned {err}")


class StubLaunch(LaunchSite):
    """A bound launch of a StubKernel: one Python call a launch, as a BoundLaunch's replay.
    Like a BoundLaunch it offers the inline route (Note [Inline launches]): its pointers packed
    into a buffer of its own, and a call (a C call returning 0 where nothing is logged), so
    a stubbed replay runs the straight route a GPU replay runs (Note [Straight runs])."""

    __slots__ = ("last", "_thread", "_fill", "_buffer", "_pointers_of", "_call")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._thread = threading.get_ident()
        packer = struct.Struct("@" + "Q" * len(self.pointers))
        self._fill = packer.pack_into if self.pointers else None
        self._buffer = bytearray(max(packer.size, 8))
        indices = tuple(index for _, index in self.pointers)
        self._pointers_of = (operator.itemgetter(*indices) if len(indices) > 1 else
                             (lambda env, i=indices[0]: (env[i],)) if indices else None)  # fmt: skip
        self._call = int if self.kernel.log is None else partial(self._logged, packer)

    def _logged(self, packer: struct.Struct) -> int:
        args = list(self.template)
        for (pos, _), ptr in zip(self.pointers, packer.unpack_from(self._buffer)):
            args[pos] = ptr
        self.last = args
        self.kernel.log.append((self.kernel.name, self.grid, self.block, self.shared_mem,
                                self.cooperative, self.dependent, self.arg_types, args))  # fmt: skip
        return 0

    def binding(self) -> tuple:
        """(the binding thread, no device, a stream getter): BoundLaunch.binding's form."""
        return self._thread, None, _stub_stream

    def inlined(self) -> tuple | None:
        """BoundLaunch.inlined's (fill, buffer, pointers, call); None where scalars are read."""
        if self.values:
            return None
        return self._fill, self._buffer, self._pointers_of, self._call

    def __call__(self, env) -> None:
        args = list(self.template)
        for pos, index in self.pointers:
            args[pos] = env[index].data_ptr()
        for pos, index in self.values:
            args[pos] = env[index]
        self.last = args
        log = self.kernel.log
        if log is not None:
            log.append((self.kernel.name, self.grid, self.block, self.shared_mem,
                        self.cooperative, self.dependent, self.arg_types, args))  # fmt: skip

    def replay(self) -> None:
        log = self.kernel.log
        if log is not None:
            log.append((self.kernel.name, self.grid, self.block, self.shared_mem,
                        self.cooperative, self.dependent, self.arg_types, self.last))  # fmt: skip


def _stub_stream(index: Any) -> int:
    return 0


@contextlib.contextmanager
def stub_launches(target: str = "h100", log: list | None = None) -> Iterator[list | None]:
    """Within it, CPU inputs take the GPU path: plans are made for `target` (kernels compiled
    through the store as on a GPU machine), launched by StubKernels (into `log` when given),
    and outputs are allocated on the CPU."""
    from fusion_cache.runtime import compile_ahead, execute, executor, sequence
    from schedulers.device import resolve_target

    profile = resolve_target(target)
    saved = (executor.FusionExecutor.plan, execute._on_gpu, sequence._on_gpu,
             executor.LaunchPlan.barrier, compile_ahead.profile_for)

    def plan(self, values, key, device=None):
        found = self.plans.get(key)
        if found is None:
            try:
                found = self.make_plan(values, profile, load=False)
            except executor.FusionUnsupportedError as why:
                found = executor.ReferencePlan(str(why))
            if isinstance(found, executor.LaunchPlan):
                found.kernels = [StubKernel(r.name, log) for r in found.refs]
                found.device = torch.device("cpu")
                # 0-dim tensors stand for the CPU scalars a GPU run copies over
                found.host_inputs = tuple(i for i, v in enumerate(values)
                                          if isinstance(v, torch.Tensor) and v.dim() == 0)
            self.plans[key] = found
        return found

    def on_gpu(values) -> bool:
        return any(isinstance(v, torch.Tensor) for v in values)

    def barrier(self) -> torch.Tensor:
        return torch.zeros(2, dtype=torch.int32)

    executor.FusionExecutor.plan = plan
    execute._on_gpu = sequence._on_gpu = on_gpu
    executor.LaunchPlan.barrier = barrier
    compile_ahead.profile_for = lambda values: profile if on_gpu(values) else None
    try:
        yield log
    finally:
        (executor.FusionExecutor.plan, execute._on_gpu, sequence._on_gpu,
         executor.LaunchPlan.barrier, compile_ahead.profile_for) = saved  # fmt: skip


def count_python_calls(fn: Callable[[], Any]) -> int:
    """The Python functions `fn()` enters (C functions not counted)."""
    calls = 0

    def profiler(frame, event, arg):
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(profiler)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls - 1  # fn itself


# ---- timing -----------------------------------------------------------------------------------


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def per_call_us(fn: Callable[[], Any], calls: int, rounds: int, device: str) -> float:
    for _ in range(min(calls, 100)):
        fn()
    times = []
    for _ in range(rounds):
        _sync(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync(device)
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def host_us(fn: Callable[[], Any], rounds: int, device: str, batch: int = 200) -> float:
    """Issue time alone: batches short enough that the driver's queue never blocks them,
    synchronized before each, not after."""
    times = []
    for _ in range(rounds * 4):
        _sync(device)
        start = time.perf_counter()
        for _ in range(batch):
            fn()
        times.append((time.perf_counter() - start) / batch * 1e6)
    _sync(device)
    return statistics.median(times)


def launches_only(region: Any, args: list) -> Callable[[], None]:
    """The region's kernel launches with their arguments packed by one run of the region:
    what the target excludes (Note [Bound launches]: `replay` is the driver call alone)."""
    from fusion_cache.runtime.sequence import KernelStep

    (seq,) = region.sequences
    env = [*args, *seq.pad]
    for step in seq.steps:  # one run to fill every slot and pack every launch's arguments
        step.run(env)
    replays = [launch.replay for step in seq.steps if isinstance(step, KernelStep)
               for launch in step.launches]  # fmt: skip

    def run() -> None:
        for replay in replays:
            replay()

    run.keep = env  # type: ignore[attr-defined]  (the buffers the pointers name stay alive)
    return run


def allocations_only(seq: Any) -> Callable[[], None]:
    """The sequence's output and intermediate allocations alone, as its kernel steps make them."""
    from fusion_cache.runtime.sequence import KernelStep

    allocs = [(step.empty, a) for step in seq.steps if isinstance(step, KernelStep)
              for a in (*step.fresh, *((s, (n,), (1,), d) for s, n, d in step.arenas))]

    def run() -> None:
        for empty, (_, shape, stride, dtype) in allocs:
            empty(shape, stride, dtype)

    return run


def measure(case: RegionCase, device: str, calls: int, rounds: int) -> dict[str, Any]:
    region, args, eager = region_of(case, device)
    fd, _ = next(iter(region._definitions.values()))
    region(*args)  # record the sequence
    (seq,) = region.sequences
    row: dict[str, Any] = {"case": case.name, "sequence": seq.describe(), "launches": seq.launches}
    row["region_us"] = per_call_us(lambda: region(*args), calls, rounds, device)
    row["launches_us"] = per_call_us(launches_only(region, args), calls, rounds, device)
    row["overhead_us"] = row["region_us"] - row["launches_us"]
    guard = region._last[0]
    # the same, issue time alone (no synchronize in the timing): what a host-bound step pays
    row["region_host_us"] = host_us(lambda: region(*args), rounds, device)
    row["launches_host_us"] = host_us(launches_only(region, args), rounds, device)
    row["overhead_host_us"] = row["region_host_us"] - row["launches_host_us"]
    row["guard_us"] = per_call_us(lambda: guard.matches(args), calls, rounds, device)
    row["allocs_us"] = per_call_us(allocations_only(seq), calls, rounds, device)
    row["execute_us"] = per_call_us(lambda: fd.execute(args), calls, rounds, device)
    row["eager_us"] = per_call_us(eager, calls, rounds, device)
    row["python_calls"] = count_python_calls(lambda: region(*args))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.host_region", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--stub", action="store_true", help="CPU, plans for h100, stub launches")
    parser.add_argument("-k", dest="only", default=None, help="cases whose name contains this")
    parser.add_argument("--json", default=None, help="write the rows to this file")
    args = parser.parse_args(argv)
    if not args.stub and not torch.cuda.is_available():
        parser.error("no CUDA GPU: pass --stub to measure the Python path with stub launches")
    device = "cpu" if args.stub else "cuda"
    rows = []
    with stub_launches() if args.stub else contextlib.nullcontext():
        for case in CASES:
            if args.only and args.only not in case.name:
                continue
            rows.append(measure(case, device, args.calls, args.rounds))
            r = rows[-1]
            print(f"{r['case']:<22} region {r['region_us']:6.1f} us  launches {r['launches_us']:6.1f}"
                  f"  overhead {r['overhead_us']:5.1f} (guard {r['guard_us']:4.1f}, allocations"
                  f" {r['allocs_us']:4.1f})  host: region {r['region_host_us']:5.1f} launches"
                  f" {r['launches_host_us']:4.1f} overhead {r['overhead_host_us']:4.1f}"
                  f"  execute {r['execute_us']:6.1f}"
                  f"  eager {r['eager_us']:6.1f}  python calls {r['python_calls']:3d}"
                  f"  [{r['sequence']}]", flush=True)  # fmt: skip
    if args.json:
        meta = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu (stub)",
                "torch": torch.__version__, "calls": args.calls, "rounds": args.rounds}  # fmt: skip
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
