"""The aten benchmark family (benchmarks/aten_cases.py) through the library on the CPU, at
small shapes, against each case's reference: eager, or for the random cases eager replayed
on the fusion's own dropout mask."""
import pytest
import torch
from test_benchmarks_cpu import small_shape

from benchmarks.cases import CASES, Case

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
    max_err, problem = case.compare(outputs, case.reference(inputs, outputs))
    assert problem is None, problem
    assert max_err is not None
