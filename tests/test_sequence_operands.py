"""ATen steps' operands in launch sequences (fusion_cache/runtime/sequence.py), on the CPU.

Note [Operands laid out by their kernels]: an ATen step reading a kernel step's output through a
view reads it as allocated in that view's layout, checks no operand whose layout the sequence
fixes, and computes what it computed. Note [GEMM operands shared]: kernel outputs only kernels
and GEMMs read are carved from one arena."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fusion_cache import DataType, FusionDefinition
from fusion_cache.runtime.aten_calls import prepare_call, reinterpret, reinterpret_tensor
from fusion_cache.runtime.sequence import AtenStep, KernelStep, LaunchSequence

pytestmark = pytest.mark.skipif(reinterpret_tensor is None, reason="no _reinterpret_tensor")


class _SquareLaunch:
    """A kernel squaring slot 0 into slot 2 through its address, as [24, 8] rows (a launch
    reads pointers only: it writes the bytes whatever the slot's tensor says its layout is)."""

    pointers = ((0, 0), (1, 2))
    values = ()
    count = 1

    def __call__(self, env: list) -> None:
        reinterpret(env[2], (24, 8), (8, 1), 0).copy_(env[0] * env[0])


def _transposed_product() -> FusionDefinition:
    """matmul(h.t(), g): an ATen segment whose first operand is a view of its input."""
    with FusionDefinition() as fd:
        h = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        g = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.matmul(fd.ops.permute(h, [1, 0]), g))
    return fd


def _sequence(monkeypatch, on: bool) -> LaunchSequence:
    """Slots: 0 x [24, 8], 1 g [24, 3] (inputs), 2 = x * x (a kernel step), 3 = (x * x).t() @ g
    (an ATen step, the sequence's output)."""
    monkeypatch.setenv("FUSION_CACHE_LAID_OUT_OPERANDS", "1" if on else "0")
    call = prepare_call(_transposed_product(), [torch.randn(24, 8), torch.randn(24, 3)])
    assert call is not None and call.direct is not None
    kernel = KernelStep(((2, (24, 8), (8, 1), torch.float32),), (), (_SquareLaunch(),),
                        SimpleNamespace(device=torch.device("cpu")), None)  # fmt: skip
    aten = AtenStep(call, (2, 1), (3,))
    fd = SimpleNamespace(_cache=SimpleNamespace(counters={"kernel_launches": 0}), _fid=0)
    return LaunchSequence(fd, 2, 4, [kernel, aten], (3,))


def test_a_kernel_output_read_through_a_view_is_allocated_in_its_layout(monkeypatch):
    seen = {}
    for on in (False, True):
        seq = _sequence(monkeypatch, on)
        kernel, aten = seq.steps
        operands: list = []

        def spy(a, b, fn=aten.fn, operands=operands):
            operands.append((a.shape, a.stride(), b.stride()))
            return fn(a, b)

        aten.fn = spy  # the closures made again, over the spy (laid out already: unchanged)
        fd = SimpleNamespace(_cache=SimpleNamespace(counters={"kernel_launches": 0}), _fid=0)
        seq = LaunchSequence(fd, 2, 4, [kernel, aten], (3,))
        x, g = torch.randn(24, 8), torch.randn(24, 3)
        (out,) = seq.run([x, g])
        torch.testing.assert_close(out, (x * x).t() @ g)
        seen[on] = (kernel.allocs, aten.args, aten.checks, operands)
    # the same torch call on an operand of the same layout, with the view made or not
    assert seen[True][3] == seen[False][3] == [((8, 24), (1, 8), (3, 1))]
    assert seen[False][0] == ((2, (24, 8), (8, 1), torch.float32),)
    assert seen[False][1][0] == (2, ((8, 24), (1, 8), 0)) and seen[False][2] == ((2, (8, 1)),)
    assert seen[True][0] == ((2, (8, 24), (1, 8), torch.float32),)
    assert seen[True][1][0] == (2, None) and seen[True][2] == ()


def test_the_prepared_path_gets_the_recorded_layout_back(monkeypatch):
    """Where an ATen step falls back on its prepared call (another operand laid out otherwise),
    a relaid operand is viewed back as recorded: the same result."""
    seq = _sequence(monkeypatch, True)
    kernel, aten = seq.steps
    x, g = torch.randn(24, 8), torch.randn(24, 3)
    env = [x, g, None, None]
    kernel.run(env)
    assert env[2].shape == (8, 24)
    aten._prepared(env)
    torch.testing.assert_close(env[3], (x * x).t() @ g)


def test_an_output_keeps_its_layout(monkeypatch):
    """A slot the region returns is not relaid: its readers outside the sequence see it as
    recorded."""
    monkeypatch.setenv("FUSION_CACHE_LAID_OUT_OPERANDS", "1")
    call = prepare_call(_transposed_product(), [torch.randn(24, 8), torch.randn(24, 3)])
    kernel = KernelStep(((2, (24, 8), (8, 1), torch.float32),), (), (_SquareLaunch(),),
                        SimpleNamespace(device=torch.device("cpu")), None)  # fmt: skip
    aten = AtenStep(call, (2, 1), (3,))
    fd = SimpleNamespace(_cache=SimpleNamespace(counters={"kernel_launches": 0}), _fid=0)
    seq = LaunchSequence(fd, 2, 4, [kernel, aten], (2, 3))
    x, g = torch.randn(24, 8), torch.randn(24, 3)
    square, out = seq.run([x, g])
    assert square.shape == (24, 8) and kernel.allocs[0][1] == (24, 8)
    assert aten.checks == ()  # its layout is the sequence's own all the same
    torch.testing.assert_close(out, square.t() @ g)


class _Launch:
    """A kernel writing `make(env[0])` into slot `slot` through its address, as [24, 8] rows."""

    values = ()
    count = 1

    def __init__(self, slot: int, make) -> None:
        self.pointers = ((0, 0), (1, slot))
        self.slot, self.make = slot, make

    def __call__(self, env: list) -> None:
        reinterpret(env[self.slot], (24, 8), (8, 1), 0).copy_(self.make(env[0]))


def _two_gemms(monkeypatch, shared: bool) -> LaunchSequence:
    """Slots: 0 x [24, 8], 1 g [24, 3]; kernels make 2 = x * x and 3 = x + x, GEMMs 4 = 2.t() @
    g and 5 = 3.t() @ g (the outputs): 2 and 3 are intermediates only kernels and GEMMs touch."""
    monkeypatch.setenv("FUSION_CACHE_GEMM_OPERANDS_SHARED", "1" if shared else "0")
    monkeypatch.setenv("FUSION_CACHE_LAID_OUT_OPERANDS", "0")  # the operands viewed, as recorded
    call = prepare_call(_transposed_product(), [torch.randn(24, 8), torch.randn(24, 3)])
    plan = SimpleNamespace(device=torch.device("cpu"))
    steps = [KernelStep(((2, (24, 8), (8, 1), torch.float32),), (),
                        (_Launch(2, lambda x: x * x),), plan, None),
             KernelStep(((3, (24, 8), (8, 1), torch.float32),), (),
                        (_Launch(3, lambda x: x + x),), plan, None),
             AtenStep(call, (2, 1), (4,)), AtenStep(call, (3, 1), (5,))]  # fmt: skip
    fd = SimpleNamespace(_cache=SimpleNamespace(counters={"kernel_launches": 0}), _fid=0)
    return LaunchSequence(fd, 2, 6, steps, (4, 5))


@pytest.mark.parametrize("shared", [False, True], ids=["apart", "shared"])
def test_gemm_operands_share_an_arena(monkeypatch, shared):
    seq = _two_gemms(monkeypatch, shared)
    first, second = seq.steps[:2]
    carved = {slot for step in (first, second) for slot, *_ in step.carves}
    assert carved == ({2, 3} if shared else set())
    assert bool(first.arenas) is shared and not second.arenas
    for _ in range(2):
        x, g = torch.randn(24, 8), torch.randn(24, 3)
        square, double = seq.run([x, g])
        torch.testing.assert_close(square, (x * x).t() @ g)
        torch.testing.assert_close(double, (x + x).t() @ g)


@pytest.mark.parametrize("on", [False, True], ids=["checked", "pinned"])
def test_recorded_views_of_kernel_outputs_check_no_strides(monkeypatch, on):
    """Note [Recorded views]: a view the region returns of a kernel step's output (laid out by
    the sequence itself) checks its source's strides no more than a view of an input does."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from benchmarks.host_region import stub_launches
    from fusion_cache.frontends.fx_region import RecordedView, RegionCall, build_region, spec_of

    monkeypatch.setenv("FUSION_CACHE_LAID_OUT_OPERANDS", "1" if on else "0")

    def fn(x, w):
        y = x * 2.0
        return y.view(24), w.t(), y

    args = [torch.randn(4, 6), torch.randn(3, 6)]
    gm = make_fx(fn)(*args)
    specs = tuple(spec_of(a) for a in args)
    fd, constants = build_region(gm, specs)
    with stub_launches():
        region = RegionCall("r", gm, fd, specs, constants)
        for _ in range(2):
            x, w = torch.randn(4, 6), torch.randn(3, 6)
            got = region(x, w)
            assert got[0].shape == (24,) and got[1].stride() == (1, 6)
            assert got[0].untyped_storage().data_ptr() == got[2].untyped_storage().data_ptr()
    views = {k: v for k, v in region._last[2] if isinstance(v, RecordedView)}
    assert views[1].strides is None  # an input's view: the guard pins it either way
    assert (views[0].strides is None) is on
