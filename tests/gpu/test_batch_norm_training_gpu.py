"""Batch norm in training through the generated kernels, at ResNet-18's (CIFAR, batch 64)
sizes: f64 matches torch to rounding, f32 is as close to the f64 result as torch's f32
(cuDNN's batch norm), forward, running statistics and backward."""
import pytest
import torch

from tests import bn_regions

pytestmark = pytest.mark.gpu

SHAPES = [(64, 64, 32, 32), (64, 128, 16, 16), (64, 512, 4, 4), (7, 5, 9, 11)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_batch_norm_training_f32_as_close_to_f64_as_torch(shape):
    gen = torch.Generator().manual_seed(sum(shape))
    for name, (ours, theirs, exact) in bn_regions.run_both(shape, torch.float32, "cuda",
                                                           gen).items():  # fmt: skip
        mine, torch_error = bn_regions.worst(ours, exact), bn_regions.worst(theirs, exact)
        print(f"{shape} {name}: ours {mine:.2e} torch {torch_error:.2e}")
        assert mine <= max(4 * torch_error, 4 * torch.finfo(torch.float32).eps), (name, mine,
                                                                                   torch_error)


@pytest.mark.parametrize("shape", SHAPES[2:], ids=str)
def test_batch_norm_training_f64_matches_torch(shape):
    gen = torch.Generator().manual_seed(sum(shape) + 1)
    for name, (ours, theirs, _) in bn_regions.run_both(shape, torch.float64, "cuda",
                                                       gen).items():  # fmt: skip
        torch.testing.assert_close(ours, theirs, rtol=1e-11, atol=1e-11, msg=name)


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("switches", ["COUNTERS_REGION=0", "",
                                      "LONE_CONVOLUTIONS=1,PAIRED_PIECES=1,PACKED_OUTPUTS=1"])
def test_buffers_after_training_steps_match_eager(monkeypatch, switches):
    """Running statistics and batch counters (0-d CUDA tensors: Note [Counter updates]) after
    three compiled steps are eager's; with the counters' region (the default), no counter is
    left to eager, and with the other switches no convolution either."""
    import copy

    import torch.nn as nn

    from benchmarks.model_defs import BasicBlock
    from fusion_cache.frontends import dynamo_backend

    for item in switches.split(",") if switches else []:
        name, value = item.split("=")
        monkeypatch.setenv(f"FUSION_CACHE_{name}", value)
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16),
                          nn.ReLU(), BasicBlock(16, 32, 2)).cuda()  # fmt: skip
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, backend="fusion_cache")
    for _ in range(3):
        x = torch.randn(8, 3, 16, 16, device="cuda")
        eager(x).square().mean().backward()
        compiled(x).square().mean().backward()
    for (name, got), want in zip(compiled_model.named_buffers(), eager.buffers()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)
    # the gradients (their small ones packed together under PACKED_OUTPUTS), loosely: TF32
    # convolutions on inputs a few ulps apart
    for (name, got), want in zip(compiled_model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-2, atol=1e-3, msg=name)
    forward = next(r for r in dynamo_backend.reports() if r["graph"] == "forward")
    if "COUNTERS_REGION=0" not in switches:
        assert "add_" not in forward["eager_ops"], forward["eager_ops"]
        assert forward["fused_ops"].get("add_") == 4, forward["fused_ops"]
    if "LONE" in switches:
        assert "convolution" not in forward["eager_ops"], forward["eager_ops"]
