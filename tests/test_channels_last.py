"""Note [Channels-last convolutions] on the CPU: FUSION_CACHE_CONV_LAYOUT=channels_last makes
the convolution records ask for channels-last activations, the regions around them write their
4-D results channels-last, segments hand such values over in that layout, and a residual block
trained through the backend matches eager; the pointwise plan of channels-last tensors walks
them in memory order (Note [Loop in memory order]); a residual block's batch norms join the add
that reads them (Note [Region cuts])."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from fusion_cache import FusionDefinition
from fusion_cache.frontend.dtypes import DataType
from fusion_cache.frontends import dynamo_backend, register_backend
from fusion_cache.ir.output_layout import channels_last_order, output_stride_orders
from fusion_cache.ir.shape_eval import runtime_shapes
from fusion_cache.runtime.executor import executor_for
from fusion_cache.runtime.segmented import dense_as
from schedulers.device import resolve_target
from schedulers.registry import plan_for

CL = [3, 0, 2, 1]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    import torch._dynamo

    register_backend()
    torch._dynamo.reset()
    dynamo_backend.reset_reports()
    yield
    torch._dynamo.reset()


class Block(nn.Module):
    """A stem and a residual block with a strided shortcut (conv + batch norm), training."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(4)
        self.conv1 = nn.Conv2d(4, 6, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(6)
        self.conv2 = nn.Conv2d(6, 6, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(6)
        self.short = nn.Conv2d(4, 6, 1, stride=2, bias=False)
        self.bn_short = nn.BatchNorm2d(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn0(self.stem(x)))
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(h)))))
        return torch.relu(y + self.bn_short(self.short(h))).mean((2, 3)).square().sum()


def _train_both(monkeypatch, layout: str) -> tuple[nn.Module, nn.Module]:
    monkeypatch.setenv("FUSION_CACHE_CONV_LAYOUT", layout)
    torch.manual_seed(0)
    mine = Block().double()
    theirs = Block().double()
    theirs.load_state_dict(mine.state_dict())
    compiled = torch.compile(mine, backend="fusion_cache")
    for step in range(2):
        x = torch.randn(2, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(step))
        compiled(x).backward()
        theirs(x).backward()
    return mine, theirs


def _regions() -> list:
    return [r for rep in dynamo_backend._reports for r in rep.regions_list]


@pytest.mark.parametrize("layout", ["channels_last", "as_traced"])
def test_residual_block_trains_as_eager(monkeypatch, layout):
    mine, theirs = _train_both(monkeypatch, layout)
    for (name, a), b in zip(mine.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)
    for (name, a), b in zip(mine.named_buffers(), theirs.buffers()):
        torch.testing.assert_close(a, b, msg=name)
    forward = next(r for r in dynamo_backend.reports() if r["graph"] == "forward")
    # Note [Region cuts]: the block's last batch norm joins the add with the shortcut's
    assert "_native_batch_norm_legit_functional" not in forward["eager_ops"], forward["eager_ops"]
    convs = [r for region in _regions() for fd, _ in region._definitions.values()
             for r in fd.records if r.kind == "op" and "convolution" in r.name]  # fmt: skip
    assert convs and all(r.kw("channels_last", False) == (layout == "channels_last")
                         for r in convs)  # fmt: skip
    if layout == "channels_last":
        # a convolution alone (the stem, the shortcut) is a region: it converts once
        assert "convolution" not in forward["eager_ops"], forward["eager_ops"]


def test_regions_write_their_4d_results_channels_last(monkeypatch):
    """Every region definition that ran returns its 4-D values in channels-last order."""
    _train_both(monkeypatch, "channels_last")
    orders = []
    for region in _regions():
        ran = {seq.fusion_id for seq in region.sequences}  # not the traced (NCHW) ones
        for fd, _ in region._definitions.values():
            if fd.id() not in ran:
                continue
            ranks = [fd._infos[r.args[0].index].ndim for r in fd.output_records()]
            orders += [tuple(o) for o, n in zip(output_stride_orders(fd), ranks) if n == 4]
    assert orders and set(orders) == {tuple(CL)}, set(orders)


def test_dense_as_lays_out_in_stride_order():
    x = torch.randn(2, 3, 4, 5)
    cl = dense_as(channels_last_order(4))(x)
    assert cl.is_contiguous(memory_format=torch.channels_last) and torch.equal(cl, x)
    assert dense_as(channels_last_order(4))(cl) is cl
    odd = dense_as([1, 2, 0, 3])(x)  # dims by stride, outermost first: 3, 1, 0, 2
    assert odd.stride() == (4, 8, 1, 24) and torch.equal(odd, x)
    assert dense_as(())(x) is x


def test_channels_last_pointwise_plan_walks_memory_order():
    """Note [Loop in memory order]: channels-last inputs, a per-channel scale and a
    channels-last output collapse to [N*H*W, C] with vector loads (h100 plan, meta inputs);
    the logical order would leave four strided dims."""
    x = torch.empty(8, 64, 16, 16, device="meta").to(memory_format=torch.channels_last)
    with FusionDefinition() as fd:
        a = fd.define_tensor(sizes=list(x.shape), strides=list(x.stride()))
        s = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Float)
        y = fd.ops.relu(fd.ops.mul(a, fd.ops.broadcast(s, [True, False, True, True])))
        fd.add_output(y, stride_order=CL)
    ex = executor_for(fd)
    inputs = [x, torch.empty(64, device="meta")]
    spec = plan_for(ex.scheduler, ex.program, inputs, runtime_shapes(ex.fd, inputs),
                    resolve_target("h100"))  # fmt: skip
    assert spec.outputs[0].strides == x.stride(), spec.outputs
    assert "rank=2 vec=4" in spec.description and "strided" not in spec.description, \
        spec.description

