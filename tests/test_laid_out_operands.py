"""Note [Operands laid out by their kernels] (fusion_cache/runtime/sequence.py), on the CPU: an
ATen step reading a kernel step's output through a view reads it as allocated in that view's
layout, checks no operand whose layout the sequence fixes, and computes what it computed."""
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
        operands = []
        fn = aten.fn
        aten.fn = lambda a, b: (operands.append((a.shape, a.stride(), b.stride())), fn(a, b))[1]
        seq = LaunchSequence.__new__(LaunchSequence)  # the closures again, over the spy
        seq.__init__(SimpleNamespace(_cache=SimpleNamespace(counters={"kernel_launches": 0}),
                                     _fid=0), 2, 4, [kernel, aten], (3,))  # fmt: skip
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
