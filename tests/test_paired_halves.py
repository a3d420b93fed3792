"""Note [Paired halves] (schedulers/resize.py): pointwise kernels whose threads take a vector
in each half of the innermost dim, reading rotate-half partners once. Planned for h100
(NVRTC compiles them) and run on the host by g++ (tests/host_kernels.py) against torch, at
odd outer sizes, for RoPE forward and backward and the other resize patterns (which pair
where a window splits the innermost dim in halves and stay unpaired elsewhere)."""
from __future__ import annotations

import pytest
import torch
from host_kernels import HAVE_GXX, run_plan_on_host
from resize_patterns import PATTERNS, define

from fusion_cache.runtime.executor import executor_for
from schedulers.tuning import overriding

needs_gxx = pytest.mark.skipif(not HAVE_GXX, reason="no g++ to run kernels on the host")


def _close(got, want, dtype):
    t = {torch.bfloat16: 3e-2, torch.float32: 1e-5}[dtype]
    torch.testing.assert_close(got, want, rtol=t, atol=t)


@needs_gxx
@pytest.mark.parametrize("vec", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["rope_fwd", "rope_bwd"])
def test_rope_pairs_halves_and_matches_torch(name, dtype, vec):
    pattern = PATTERNS[name]
    with overriding({"pointwise.pair": True, "pointwise.vec": vec, "pointwise.unroll": 2}):
        fd = define(pattern, dtype)
        for shape in [(2, 3, 5, 16), (1, 3, 7, 32)]:
            inputs = pattern.make(dtype, "cpu", shape)
            (got,) = run_plan_on_host(fd, inputs)
            desc = executor_for(fd).last_plan.spec.description
            assert " pair=" in desc and f"vec={vec}" in desc, desc
            _close(got, pattern.reference(*inputs), dtype)


@needs_gxx
@pytest.mark.parametrize("name", sorted(set(PATTERNS) - {"rope_fwd", "rope_bwd"}))
def test_other_patterns_with_pairing_asked_for(name):
    """Pairing is taken only where it saves a read; the values stay torch's either way."""
    pattern = PATTERNS[name]
    with overriding({"pointwise.pair": True}):
        fd = define(pattern, torch.float32)
        inputs = pattern.make(torch.float32, "cpu", pattern.shape)
        got = run_plan_on_host(fd, inputs)
    want = pattern.reference(*inputs)
    for g, w in zip(got, want if isinstance(want, list) else [want]):
        _close(g, w, torch.float32)


def test_cat_of_other_parts_stays_unpaired():
    """cat3's windows split the innermost dim at its half too, but no part reads another's
    values: pairing would save no read."""
    pattern = PATTERNS["cat3"]
    fd = define(pattern, torch.bfloat16)
    fd.precompile(pattern.make(torch.bfloat16, "meta", (8192, 4096)), target="h100")
    assert " pair=" not in executor_for(fd).last_plan.spec.description


def test_rope_at_benchmark_size_reads_x_once_a_half():
    """x is read at each half once: the partner reads take the other half's vector, and the
    loads outside their window are gone."""
    pattern = PATTERNS["rope_fwd"]
    with overriding({"pointwise.pair": True, "pointwise.vec": 8}):
        fd = define(pattern, torch.bfloat16)
        (ref,) = fd.precompile(pattern.make(torch.bfloat16, "meta", (8, 32, 2048, 128)),
                               target="h100")  # fmt: skip
    desc = executor_for(fd).last_plan.spec.description
    assert "pair=load/load,load/load,a0.1/dead,dead/a0.0,load/load" in desc, desc
    body = ref.source[ref.source.index('extern "C"'):]
    assert body.count("= fc_load_vec_hint<FC_VEC, 0>(") == 6, body
    assert "fc_load_vec_if" not in body
