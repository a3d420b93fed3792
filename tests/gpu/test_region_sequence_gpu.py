"""Launch sequences on CUDA (Note [Launch sequence]): a replay computes what execute() does,
for one-kernel, cooperative, aliasing, CPU-scalar and segmented plans, and a segment that
reads no tensor runs on the GPU, not on the reference evaluator."""
from __future__ import annotations

import pytest
import torch

from fusion_cache import DataType, FusionCache, FusionDefinition
from fusion_cache.runtime.sequence import ExecuteStep, Guard, sequence_for
from tests import test_region_sequence as cpu_cases

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", cpu_cases.CASES)
def test_replay_matches_execute(name):
    if name.startswith("aten") and not cpu_cases.HAS_ATEN:
        pytest.skip("this build's frontend has no ATen ops")
    fd, inputs = cpu_cases._inputs(name)
    inputs = [t.cuda() if t.dim() else t for t in inputs]  # 0-dim ones stay CPU scalars
    want = fd.execute([t.clone() for t in inputs])
    replay_inputs = [t.clone() for t in inputs]
    seq, first = sequence_for(fd, replay_inputs)
    assert not any(isinstance(s, ExecuteStep) for s in seq.steps), seq.describe()
    fresh = [t.clone() for t in inputs]
    again = seq.run(fresh)
    assert Guard(inputs).matches(fresh)
    for got in (first, again):
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
    if name == "batch_norm_aliases":  # running statistics updated in place, as execute does
        torch.testing.assert_close(fresh[3], replay_inputs[3])


def test_a_segment_reading_no_tensor_runs_on_the_gpu():
    """A constant output beside a reduction: the constant's segment reads nothing, and runs
    where the fusion's tensors are."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.sum(x, [1]))
        fd.add_output(fd.ops.full([4, 8], 2.5, DataType.Float))
    x = torch.randn(16, 64, device="cuda")
    before = FusionCache.get().stats()["reference_runs"]
    for outs in (fd.execute([x]), sequence_for(fd, [x])[1]):
        torch.testing.assert_close(outs[0], x.sum(1))
        assert outs[1].is_cuda and torch.equal(outs[1], torch.full((4, 8), 2.5, device="cuda"))
    assert FusionCache.get().stats()["reference_runs"] == before


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_replay_with_shared_intermediates_matches_eager(dtype):
    """Note [Shared intermediates]: five segments whose four intermediates are carved from
    one arena, the first and third at the same address: replays on fresh inputs give eager's
    values."""
    from tests import segment_patterns as sp

    fd = sp.chain_with_boundaries(5, dtype)
    x = torch.randn(64, 1000, device="cuda", dtype=dtype)
    seq, _ = sequence_for(fd, [x])
    assert any(s.carves for s in seq.steps if hasattr(s, "carves")), seq.describe()
    for _ in range(3):
        x = torch.randn(64, 1000, device="cuda", dtype=dtype)
        (got,) = seq.run([x])
        (want,) = sp.chain_eager(5)(x.float())
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
