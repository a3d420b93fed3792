"""The aten benchmark family (benchmarks/aten_cases.py) through the library on the CPU, at
small shapes, against each case's reference: eager, or for the random cases eager replayed
on the fusion's own dropout mask."""
import pytest
import torch
from test_benchmarks_cpu import small_shape

from benchmarks.cases import CASES, Case, as_list

ATEN = [c for c in CASES if c.family == "aten"]


def test_the_family_has_the_issue_cases():
    assert sorted(c.op for c in ATEN) == ["attention", "dropout_ln", "dropout_ln_bwd",
                                           "gpt_mlp", "linear_bias_gelu"]  # fmt: skip


@pytest.mark.parametrize("case", ATEN, ids=lambda c: c.name)
def test_case_runs_through_the_library_on_the_cpu(case: Case):
    torch.manual_seed(0)
    shape = small_shape(case)
    inputs = case.inputs("cpu", shape)
    outputs = case.build(shape).execute(inputs)
    max_err, problem = case.check(inputs, outputs)
    assert problem is None, problem
    assert max_err is not None


@pytest.mark.parametrize("op", ["attention", "gpt_mlp"])
def test_the_check_takes_eagers_error_as_the_bar(op):
    """Note [Error against eager's own]: eager's own bf16 result passes, one with an error a
    few times eager's (a rounding step in the wrong place) does not."""
    case = next(c for c in ATEN if c.op == op)
    assert case.by_eager_error
    torch.manual_seed(1)
    shape = small_shape(case)
    inputs = case.inputs("cpu", shape)
    eager = as_list(case.eager(*inputs))
    assert case.check(inputs, eager)[1] is None
    noisy = [(t.float() * (1 + 0.03 * torch.randn_like(t.float()))).to(t.dtype) for t in eager]
    _, problem = case.check(inputs, noisy)
    assert problem is not None and "against eager's" in problem
