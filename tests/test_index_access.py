"""iota (and triu, made of iotas) in the pointwise kernel, as index accesses (Note [Index
accesses] in codegen/kernel_ir.py): planned and compiled with NVRTC here, and the plan's
strides checked to give each element its index along the iota's dim; the GPU runs are in
tests/gpu/test_conformance_gpu.py."""
from __future__ import annotations

import pytest
import torch

from fusion_cache import DataType, FusionCache, FusionDefinition
from fusion_cache.ir.decompose import expand_composites


def plan_of(fd, inputs):
    refs = fd.precompile(inputs, target="h100")
    ex = FusionCache.get().executors[fd.id()]
    return ex, ex.last_plan, refs


def index_values(ex, plan):
    """Per index access: the index each loop element reads, from the launch's arguments."""
    (kernel,) = plan.spec.kernels
    args, program = list(kernel.args), ex.program
    n_tensors = len(program.accesses) + len(program.stores)
    # sizes and numel close the tensors' part; per tensor a pointer (not for index
    # accesses) then one stride a collapsed dim
    ptrs = sum(1 for a in program.accesses if not a.virtual) + len(program.stores)
    tail = len(program.scalar_inputs) + len(program.host_scalars)
    body = args[: len(args) - tail]
    rank = (len(body) - 1 - ptrs) // (n_tensors + 1)
    sizes = body[len(body) - 1 - rank:len(body) - 1]
    out, pos = [], 0
    for a in program.accesses:
        if not a.virtual:
            pos += 1
        strides = body[pos:pos + rank]
        pos += rank
        if a.virtual:
            span = 1 + sum((n - 1) * s for n, s in zip(sizes, strides))
            out.append(torch.as_strided(torch.arange(span), sizes, strides))
    return out


def test_iota_plans_one_pointwise_kernel_and_reads_indices():
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.iota(fd.define_scalar(dtype=DataType.Int), 2, 3, DataType.Int))
    ex, plan, refs = plan_of(fd, [9])
    assert plan.spec.scheduler == "pointwise" and len(refs) == 1
    (idx,) = index_values(ex, plan)
    assert idx.flatten().tolist() == list(range(9))
    torch.testing.assert_close(fd.execute([9])[0], torch.arange(9) * 3 + 2)


@pytest.mark.parametrize("diagonal", [-1, 0, 2])
def test_triu_is_a_pointwise_kernel_of_two_iotas(diagonal):
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=DataType.BFloat16)
        fd.add_output(fd.ops.triu(t0, diagonal))
    shape = (2, 5, 7)
    ex, plan, _ = plan_of(fd, [torch.empty(shape, device="meta", dtype=torch.bfloat16)])
    assert plan.spec.scheduler == "pointwise"
    got = {tuple(v.reshape(shape)[0, :, :].flatten().tolist()) for v in index_values(ex, plan)}
    rows = torch.arange(5)[:, None].expand(5, 7).flatten().tolist()
    cols = torch.arange(7)[None, :].expand(5, 7).flatten().tolist()
    assert got == {tuple(rows), tuple(cols)}
    x = torch.randn(shape).bfloat16()
    assert torch.equal(fd.execute([x])[0], torch.triu(x, diagonal))
    # what the scheduler sees: iotas, not triu
    names = [r.name for r in expand_composites(fd)._records if r.kind == "op"]
    assert "triu" not in names and names.count("iota") == 2


def test_iota_in_a_reduction_is_left_to_a_pointwise_segment():
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1, -1], contiguity=True)
        tgt = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Int)
        io = fd.ops.iota(fd.ops.size(a, 1), 0, 1, DataType.Int)
        hit = fd.ops.eq(fd.ops.broadcast_in_dim(io, fd.ops.shape(a), [1]),
                        fd.ops.broadcast_in_dim(tgt, fd.ops.shape(a), [0]))  # fmt: skip
        fd.add_output(fd.ops.sum(fd.ops.where(hit, a, 0.0), [1]))
    ex, plan, refs = plan_of(fd, [torch.empty(8, 100, device="meta"),
                                  torch.empty(8, dtype=torch.int64, device="meta")])  # fmt: skip
    assert "reference" not in plan.description and len(refs) == 2
    a, tgt = torch.randn(8, 100), torch.randint(0, 100, (8,))
    torch.testing.assert_close(fd.execute([a, tgt])[0], a.gather(1, tgt[:, None])[:, 0])
