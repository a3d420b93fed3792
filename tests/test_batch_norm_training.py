"""Batch norm in training, lowered (aten_composite.py), against torch on the CPU through the
reference evaluator: the normalization with the biased variance, eps inside the square root,
the running statistics' momentum updates with the unbiased variance, and the backward's
gradients. f64 must match to rounding; f32 must be as close to the f64 result as torch's f32."""
import pytest
import torch

from tests import bn_regions

SHAPES = [(16, 8, 6, 6), (5, 3, 7), (64, 4)]  # 2-D conv activations, 1-D, BatchNorm1d


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_batch_norm_training_f64_matches_torch(shape):
    gen = torch.Generator().manual_seed(hash(shape) % 1000)
    for name, (ours, theirs, _) in bn_regions.run_both(shape, torch.float64, "cpu", gen).items():
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12, msg=name)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_batch_norm_training_f32_as_close_to_f64_as_torch(shape):
    gen = torch.Generator().manual_seed(hash(shape) % 1000 + 1)
    for name, (ours, theirs, exact) in bn_regions.run_both(shape, torch.float32, "cpu",
                                                           gen).items():  # fmt: skip
        assert ours.dtype == torch.float32, name
        mine, torch_error = bn_regions.worst(ours, exact), bn_regions.worst(theirs, exact)
        assert mine <= max(4 * torch_error, 4 * torch.finfo(torch.float32).eps), (name, mine,
                                                                                   torch_error)


def test_running_statistics_use_the_unbiased_variance():
    """running_var moves toward var * n / (n - 1), the normalization divides by the biased
    variance (n elements a channel)."""
    gen = torch.Generator().manual_seed(5)
    shape = (4, 2, 3, 3)
    x, w, b, rm, rv, _ = bn_regions.inputs(shape, torch.float64, "cpu", gen)
    y, mean, invstd, new_rm, new_rv = bn_regions.region_of(
        bn_regions.forward, (x, w, b, rm, rv))(x, w, b, rm, rv)  # fmt: skip
    n = 4 * 3 * 3
    var = x.transpose(0, 1).reshape(2, -1).var(1, unbiased=False)
    torch.testing.assert_close(invstd, (var + bn_regions.EPS).rsqrt())
    m = bn_regions.MOMENTUM
    torch.testing.assert_close(new_rv, (1 - m) * rv + m * var * n / (n - 1))
    torch.testing.assert_close(new_rm, (1 - m) * rm + m * x.mean((0, 2, 3)))
