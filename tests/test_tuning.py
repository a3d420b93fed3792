"""Tuning knobs (Note [Tuning knobs]) and the sweep harness, without a GPU: knobs change the
generated kernels as they say, unknown names fail loudly, and every committed sweep plan
names real cases and compiles."""
from pathlib import Path

import pytest
import torch
from fusion_patterns import define, layer_norm, softmax
from segment_patterns import layer_norm_backward, layer_norm_backward_inputs

from benchmarks.sweep import _precompile, combinations, load_plan
from fusion_cache.runtime.executor import executor_for
from schedulers.tuning import KNOBS, knob, overriding

SWEEPS = sorted((Path(__file__).parent.parent / "benchmarks" / "sweeps").glob("*.json"))


def test_knob_defaults_and_overrides_nest():
    assert knob("inner.tx", 128) == 128
    with overriding({"inner.tx": 256}):
        assert knob("inner.tx", 128) == 256
        with overriding({"load.hint": 3}):
            assert (knob("inner.tx", 0), knob("load.hint", 0)) == (256, 3)
        assert knob("load.hint", 0) == 0
    assert knob("inner.tx", 128) == 128


def test_unknown_knob_is_refused_with_the_known_names():
    with pytest.raises(KeyError, match="inner.tx"), overriding({"inner.txx": 1}):
        pass


def test_knobs_reach_the_generated_kernel():
    fd = define(softmax()[0], torch.float32, 2)
    x = torch.empty(64, 4096, device="meta")
    with overriding({"inner.pipeline": True, "inner.tx": 256}):
        fd.precompile([x], target="h100")
    spec = executor_for(fd).last_plan.spec
    assert spec.kernels[0].block[0] == 256 and "pipelined" in spec.description
    assert "fc_cp_async16(&" in spec.kernels[0].source and spec.kernels[0].shared_mem > 0
    executor_for(fd).plans.clear()
    with overriding({"inner.pipeline": False}):
        fd.precompile([x], target="h100")
    assert "fc_cp_async16(&" not in executor_for(fd).last_plan.spec.kernels[0].source


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_weights_in_registers_load_once_before_the_row_loop(dtype):
    # Note [Weights loaded once]: layer norm backward's weight (input 2, the same for every
    # row) loads into a2_w before the loop over rows: by default for 32-bit partials, and
    # for 16-bit ones, which also take the row pipeline (Note [Row pipeline])
    inputs = layer_norm_backward_inputs(4096, 4096, dtype)
    fd = layer_norm_backward(dtype)
    fd.precompile(inputs, target="h100")
    spec = executor_for(fd).last_plan.spec
    assert ("pipelined" in spec.description) is (dtype == torch.bfloat16)
    if dtype == torch.bfloat16:  # the mean and rstd of the next row load ahead as well
        assert "a0_next = p_row_ok ? a0[p_a0_row]" in spec.kernels[0].source
    for knobs, hoisted in (({}, True), ({"inner.hoist": True}, True),
                           ({"inner.hoist": False}, False)):  # fmt: skip
        fd = layer_norm_backward(dtype)
        with overriding(knobs):
            fd.precompile(inputs, target="h100")
        spec = executor_for(fd).last_plan.spec
        source = spec.kernels[0].source
        assert ("weights in registers" in spec.description) is hoisted, knobs
        assert ("a2_w[it] = fc_load_vec_if" in source) is hoisted, knobs
        if hoisted:  # loaded before the row loop, read inside it
            assert source.index("a2_w[it] = ") < source.index("for (idx_t row0 = ")
            read = "fc_bf16_at(a2_w[it], j)" if dtype == torch.bfloat16 else "a2_w[it][j]"
            assert read in source and "a2_l" not in source


def _layer_norm_plan(dtype, rows, n):
    fd = define(layer_norm()[0], dtype, 2)
    fd.precompile([torch.empty(rows, n, dtype=dtype, device="meta"),
                   *(torch.empty(n, dtype=dtype, device="meta") for _ in range(2))], target="h100")
    return executor_for(fd).last_plan.spec


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_weights_in_shared_memory_for_rows_split_over_clusters(dtype):
    # Note [Weights loaded once]: layer norm's weight and bias (inputs 1 and 2) of rows of
    # 65536, split over clusters of 8, are copied once into shared memory, each thread its
    # own chunks, before the row loop; the output pass waits for them and reads them there
    spec = _layer_norm_plan(dtype, 64, 65536)
    assert "clusters of 8, weights in shared memory" in spec.description
    assert "blocks/SM" not in spec.description  # shared memory sets the occupancy
    assert spec.kernels[0].shared_mem == 2 * (65536 // 8) * dtype.itemsize
    source = spec.kernels[0].source
    loop = source.index("for (idx_t row0 = ")
    assert source.index("extern __shared__ uint4 fc_wts[]") < source.index("fc_cp_async16(&fc_wts[") < loop
    assert source.index("fc_cp_async_wait<0>();", loop) < source.index("a1_w1 = *reinterpret_cast", loop)
    # rows of one block keep their weights in L1/L2
    assert "weights in" not in _layer_norm_plan(dtype, 64, 4096).description


def test_combinations_put_the_default_first():
    assert combinations({"a": [1, 2], "b": [3]}) == [{}, {"a": 1, "b": 3}, {"a": 2, "b": 3}]


@pytest.mark.parametrize("plan", SWEEPS, ids=lambda p: p.stem)
def test_committed_sweep_plans_name_known_cases_and_knobs(plan):
    runs = load_plan(plan)
    assert runs
    assert all(set(knobs) <= set(KNOBS) for _, knobs in runs)


def test_a_sweep_variant_compiles_without_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_DIR", str(tmp_path))
    assert _precompile(("softmax_f32_16384x4096", {"inner.pipeline": True})) is None
    assert "unknown tuning knob" in _precompile(("softmax_f32_16384x4096", {"nope": 1}))
