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
