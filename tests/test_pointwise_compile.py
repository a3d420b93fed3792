"""Without a GPU: every pointwise kernel variant the GPU tests need compiles with NVRTC for
sm_80 and sm_90, precompile works for a named target, and a warm store compiles nothing."""
import subprocess
import sys
import textwrap

import pytest
import torch

from fusion_cache import DataType, FusionCache, FusionDefinition

DTYPES = [DataType.Double, DataType.Float, DataType.Half, DataType.BFloat16, DataType.Int,
          DataType.Int32, DataType.Bool]  # fmt: skip
TORCH = {DataType.Double: torch.float64, DataType.Float: torch.float32,
         DataType.Half: torch.float16, DataType.BFloat16: torch.bfloat16,
         DataType.Int: torch.int64, DataType.Int32: torch.int32, DataType.Bool: torch.bool}  # fmt: skip


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _math_fusion(dt):
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=dt)
        b = fd.define_tensor(shape=[-1], contiguity=True, dtype=dt)
        s = fd.define_scalar(dtype=DataType.Double)
        bb = fd.ops.broadcast_in_dim(b, shape=fd.ops.shape(a), broadcast_dims=[1])
        if dt is DataType.Bool:
            fd.add_output(fd.ops.logical_or(a, bb))
            fd.add_output(fd.ops.bitwise_xor(a, fd.ops.logical_not(bb)))
        elif dt in (DataType.Int, DataType.Int32):
            fd.add_output(fd.ops.div(a, bb) + fd.ops.remainder(a, bb) * 3)
            fd.add_output(fd.ops.bitwise_left_shift(a, bb) ^ fd.ops.abs(a))
            fd.add_output(fd.ops.sin(a) * s)
        else:
            fd.add_output(fd.ops.exp(a) * s + fd.ops.tanh(bb))
            fd.add_output(fd.ops.where(a > bb, fd.ops.erfinv(a), fd.ops.lgamma(bb)))
            fd.add_output(fd.ops.cast(fd.ops.atan2(a, bb), DataType.Half))
    return fd


@pytest.mark.parametrize("target", ["a100", "h100"])
@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.value)
def test_math_kernels_compile(dt, target):
    fd = _math_fusion(dt)
    td = TORCH[dt]
    refs = fd.precompile([meta(64, 128, dtype=td), meta(128, dtype=td), 1.5], target=target)
    assert len(refs) == 1 and refs[0].arch == (80 if target == "a100" else 90)
    assert "fc_pointwise" in refs[0].source


@pytest.mark.parametrize("target", ["a100", "h100"])
def test_layout_variants_compile(target):
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1, -1, -1], contiguity=False, dtype=DataType.Float)
        b = fd.define_tensor(shape=[-1, 1, -1], contiguity=[True, None, True], dtype=DataType.BFloat16)
        c = fd.ops.permute(a, [0, 2, 1])
        out = fd.ops.permute(c, [0, 2, 1]) + fd.ops.cast(b, DataType.Float)
        fd.add_output(fd.ops.cast(out, DataType.BFloat16))
    keys = set()
    layouts = [
        (meta(4, 8, 16), meta(4, 1, 16, dtype=torch.bfloat16)),  # contiguous: collapses, vec
        (meta(4, 16, 8).transpose(1, 2), meta(4, 1, 16, dtype=torch.bfloat16)),  # strided
        (meta(4, 8, 15), meta(4, 1, 15, dtype=torch.bfloat16)),  # odd inner: no vector
        (meta(1, 8, 16), meta(1, 1, 16, dtype=torch.bfloat16)),  # size-1 dim
        (meta(0, 8, 16), meta(0, 1, 16, dtype=torch.bfloat16)),  # zero-size: no kernel
        (meta(2, 2**15, 2**16), meta(2, 1, 2**16, dtype=torch.bfloat16)),  # > 2^31: 64-bit index
    ]
    for x, y in layouts:
        for ref in fd.precompile([x, y], target=target):
            keys.add(ref.key)
    sources = [fd.cuda_code_for([x, y], target=target) for x, y in layouts[-1:]]
    assert "typedef long long idx_t;" in sources[0]
    assert len(keys) >= 4


def test_fifty_sizes_compile_at_most_two_kernels():
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.relu(a) * 2.0)
    before = FusionCache.get().stats()["kernels_compiled"]
    for n in range(1, 51):
        fd.precompile([meta(n, 1000)], target="h100")
    assert FusionCache.get().stats()["kernels_compiled"] - before <= 2


def test_refused_fusion_names_the_reason():
    with FusionDefinition() as fd:  # batch_norm in inference: no scheduler takes it (yet)
        a, m, v = (fd.define_tensor(shape=[-1] * n, contiguity=True) for n in (2, 1, 1))
        fd.add_output(fd.ops.batch_norm(a, None, None, m, v, fd.define_scalar(0.1),
                                        fd.define_scalar(1e-5), False)[0])  # fmt: skip
    with pytest.raises(RuntimeError, match=r"pointwise: batch_norm \(T\d+\) is not a pointwise op"):
        fd.precompile([meta(4, 4), meta(4), meta(4)], target="h100")


_SCRIPT = textwrap.dedent(
    """
    import json, torch
    from fusion_cache import FusionDefinition, DataType, FusionCache
    ids = []
    for k in range(5):
        with FusionDefinition() as fd:
            a = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
            fd.add_output(fd.ops.tanh(a) * float(k + 1))
        fd.precompile([torch.empty(8, 32, device="meta")], target="h100")
        ids.append(fd.id())
    print(json.dumps({"ids": ids, "stats": FusionCache.get().stats()}))
    """
)


def test_restart_on_warm_store_compiles_nothing(fresh_store):
    import json
    import os

    env = dict(os.environ, FUSION_CACHE_DIR=str(fresh_store))
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                             text=True, check=True)  # fmt: skip
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs[0]["stats"]["kernels_compiled"] == 5
    assert runs[1]["stats"]["kernels_compiled"] == 0
    assert runs[1]["stats"]["kernels_loaded"] == 5
    assert runs[0]["ids"] == runs[1]["ids"]
    # the fusion id rebuilds the definition in this (third) process and runs it on CPU
    from fusion_cache import FusionDefinition as FD

    fd = FD(runs[0]["ids"][2])
    x = torch.randn(8, 32)
    torch.testing.assert_close(fd.execute([x])[0], torch.tanh(x) * 3.0)
