"""Note [Split loops] and [Outputs of other shapes] on the GPU: RoPE on interleaved pairs
with the key heads expanded over their query heads, one kernel, against eager; odd sizes,
both dtypes, a non-contiguous input."""
from __future__ import annotations

import pytest
import torch
from test_split_loops import _key_heads, _rope_ref

from fusion_cache import DataType, FusionCache, FusionDefinition
from fusion_cache.frontend.dtypes import from_torch

pytestmark = pytest.mark.gpu
CUDA = "cuda"


def _launches() -> int:
    return FusionCache.get().stats()["kernel_launches"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b,t,kv,group,d", [(2, 6, 2, 3, 8), (3, 37, 2, 4, 64), (1, 129, 3, 5, 130)])
def test_key_heads_rope_and_expand(dtype, b, t, kv, group, d):
    fd = _key_heads(dtype, kv, group, d, b, t)
    g = torch.Generator().manual_seed(b * t + d)
    cos, sin = (torch.randn(1, t, 1, d // 2, generator=g).to(CUDA) for _ in range(2))
    k = torch.randn(b, t, kv, d, generator=g).to(dtype=dtype, device=CUDA)
    before = _launches()
    (got,) = fd.execute([cos, sin, k])
    assert _launches() - before == 1
    want = _rope_ref(k, cos, sin).to(dtype)[:, :, :, None].expand(b, t, kv, group, d)
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_heads_merged_from_a_transposed_input(dtype):
    """Value heads from a transposed tensor, expanded over their group and merged with it,
    added to a tensor of the merged shape: one kernel."""
    with FusionDefinition() as fd:
        v = fd.define_tensor(shape=[-1, -1, -1, -1], dtype=from_torch(dtype))
        y = fd.define_tensor(shape=[-1, -1, -1, -1], contiguity=[True] * 4, dtype=from_torch(dtype))
        wide = fd.ops.expand(fd.ops.broadcast(v, [False, False, False, True, False]),
                             shape=[3, 33, 2, 5, 24])  # fmt: skip
        fd.add_output(fd.ops.add(fd.ops.cast(fd.ops.reshape(wide, new_shape=[3, 33, 10, 24]),
                                             DataType.Float), fd.ops.cast(y, DataType.Float)))  # fmt: skip
    v = torch.randn(3, 2, 33, 24, device=CUDA).to(dtype).transpose(1, 2)
    y = torch.randn(3, 33, 10, 24, device=CUDA).to(dtype)
    (got,) = fd.execute([v, y])
    want = v[:, :, :, None].expand(3, 33, 2, 5, 24).reshape(3, 33, 10, 24).float() + y.float()
    torch.testing.assert_close(got, want)
