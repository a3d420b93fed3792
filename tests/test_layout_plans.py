"""The layouts benchmark family's cases at their real sizes, planned for the h100 profile
without compiling anything: which scheduler and which kernels each takes (what
`python -m benchmarks.plans` prints)."""
import pytest

from benchmarks.cases import select
from fusion_cache.ir.shape_eval import runtime_shapes
from fusion_cache.runtime.executor import executor_for
from schedulers.device import resolve_target
from schedulers.registry import plan_for

EXPECTED = {
    "transpose_add": ("transpose", ["fc_transpose"]),
    "transpose_scale": ("transpose", ["fc_transpose"]),
    "nchw_to_nhwc": ("transpose", ["fc_transpose"]),
    # a permute of outer dims: inputs and outputs share their innermost dim
    "attention_heads": ("pointwise", ["fc_pointwise"]),
    "attention_merge": ("pointwise", ["fc_pointwise"]),
    "mid_sum": ("reduction", ["fc_outer_reduction"]),
    "mid_var_mean": ("reduction", ["fc_outer_reduction"]),
    "mid_softmax": ("reduction", ["fc_column_norm"]),
    "all_sum": ("reduction", ["fc_split_reduction", "fc_outer_finish"]),
    "all_mean": ("reduction", ["fc_split_reduction", "fc_outer_finish"]),
    "short_softmax": ("reduction", ["fc_inner_reduction"]),
    "short_layer_norm": ("reduction", ["fc_inner_reduction"]),
}


@pytest.mark.parametrize("case", select(["layouts"]), ids=lambda c: c.name)
def test_each_layouts_case_takes_its_scheduler(case):
    fd = case.build()
    ex = executor_for(fd)
    inputs = case.inputs("meta")
    spec = plan_for(ex.scheduler, ex.program, inputs, runtime_shapes(ex.fd, inputs),
                    resolve_target("h100"))  # fmt: skip
    scheduler, kernels = EXPECTED[case.op]
    assert spec.scheduler == scheduler, spec.description
    assert [k.name for k in spec.kernels] == kernels, spec.description
