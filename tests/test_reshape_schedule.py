"""Without a GPU: fusions with reshapes (symbolic and static) take the pointwise and reduction
schedulers, their kernels compile with NVRTC for sm_80 and sm_90, each regrouping (keep,
merge, split, mixed) reads differently in the plan, and the errors name the reshape.

No kernel runs here, so the plans are checked by replaying them on CPU: each load of the
program becomes `torch.as_strided` over the real input with the strides the plan computed
(`emulate_pointwise` reads them from the kernel's arguments), and the statements run as torch
ops. Wrong strides through a reshape give wrong values there, as they would on the GPU.
"""
import pytest
import torch
from program_replay import eval_stmts

from fusion_cache import DataType, FusionDefinition
from fusion_cache.frontend.dtypes import to_torch
from fusion_cache.ir.shape_eval import evaluate_shapes, runtime_shapes
from fusion_cache.runtime.executor import executor_for
from fusion_cache.runtime.plans import LaunchPlan
from schedulers.base import ArgRef, SchedulerRefused
from schedulers.device import resolve_target
from schedulers.layout import access_strides
from schedulers.registry import plan_for
from schedulers.views import resolve_access

TARGETS = {"a100": 80, "h100": 90}


def rand(*shape, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype)


def one_kernel_plan(fd, inputs, target="h100"):
    """Precompile; the whole fusion must be one scheduler's plan (not segments)."""
    refs = fd.precompile(inputs, target=target)
    plan = executor_for(fd).last_plan
    assert isinstance(plan, LaunchPlan), f"segmented: {getattr(plan, 'description', plan)}"
    assert refs and all(r.arch == TARGETS[target] for r in refs)
    return plan.spec


def run_stmts(program, load, reduce_dims=None):
    """The program's statements as torch ops; `load(k)` gives access k over the loop."""

    def reduce(st, x):
        fn = {"sum": torch.sum, "max": torch.amax, "min": torch.amin}[dict(st.attrs)["op"]]
        return fn(x.to(to_torch(st.compute)), reduce_dims, keepdim=True).to(to_torch(st.dtype))

    return eval_stmts(program, load, reduce=reduce)


def emulate_pointwise(fd, values):
    """The outputs the last pointwise plan computes, its loads taken from the kernel's
    arguments (per tensor: pointer then collapsed strides; then sizes and numel)."""
    ex = executor_for(fd)
    program, spec = ex.program, ex.last_plan.spec
    (kernel,) = spec.kernels
    args = kernel.args
    slots = [i for i, a in enumerate(args) if isinstance(a, ArgRef)]
    rank = slots[1] - slots[0] - 1
    n = len(program.accesses) + len(program.stores)
    sizes = list(args[n * (rank + 1):n * (rank + 1) + rank])

    def load(k):
        t = values[program.accesses[k].input_pos]
        strides = args[slots[k] + 1:slots[k] + 1 + rank]
        return torch.as_strided(t, sizes, strides, t.storage_offset())

    env = run_stmts(program, load)
    return [torch.as_tensor(env[s.var]).expand(sizes).reshape(o.shape)
            for s, o in zip(program.stores, spec.outputs)]  # fmt: skip


def emulate_reduction(fd, values):
    """The outputs of the reduction program over the whole loop, each load strided as
    `resolve_access` says (rows keep their reduced dims as size 1 until stored)."""
    ex = executor_for(fd)
    program = ex.program
    env_shapes = runtime_shapes(ex.fd, values)
    loop = tuple(env_shapes[program.loop_state])

    def load(k):
        a = program.accesses[k]
        base = values[a.input_pos]
        t, m = resolve_access(base, a, env_shapes)
        strides = access_strides(t, m, program.rank)
        return torch.as_strided(base, loop, strides, base.storage_offset())

    env = run_stmts(program, load, list(program.reduced))
    return [stored(env[s.var], loop, env_shapes[s.state], row)
            for s, row in zip(program.stores, program.store_rowlevel)]  # fmt: skip


def stored(value, loop, shape, rowlevel):
    """A value over the loop (rows: size 1 along the reduced dims) in its output's shape."""
    value = torch.as_tensor(value)
    return value.reshape(shape) if rowlevel else value.expand(loop).reshape(shape)


def close(got, want, tol=1e-5):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.to(w.dtype), w, rtol=tol, atol=tol)


def scheduled_by(fd, name):
    ex = executor_for(fd)
    assert ex.scheduler == name, ex.refusals
    return ex


# ---- pointwise: one definition, sizes from a vector of scalar inputs -----------------------


def vector_reshape(dtype=DataType.Float):
    """exp(x) reshaped to [s0, s1, s2] (define_vector of scalar inputs), times z."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=dtype)
        z = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=dtype)
        sizes = [fd.define_scalar(dtype=DataType.Int) for _ in range(3)]
        y = fd.ops.reshape(fd.ops.exp(x), fd.define_vector(sizes))
        fd.add_output(fd.ops.mul(y, z))
    return fd


# input shape, sizes asked for, and a step the analysis must contain
REGROUPINGS = {
    "keep": ((4, 8, 32), (4, 8, 32), "keep 0->0, keep 1->1, keep 2->2"),
    "merge": ((4, 8, 32), (32, 32, 1), "merge (0,1)->0"),
    "split": ((32, 32, 1), (4, 8, 32), "split 0->(0,1)"),
    "mixed": ((32, 16, 2), (4, 8, 32), "split 0->(0,1), merge (1,2)->2"),
    "merge_split": ((4, 8, 32), (8, 4, 32), "merge-split (0,1)->(0,1)"),
    "infer": ((32, 32, 1), (4, 8, -1), "split 0->(0,1)"),
}


def vector_inputs(case, seed=0):
    shape, new, _ = REGROUPINGS[case]
    x = rand(*shape, seed=seed)
    out_shape = x.reshape(new).shape
    return [x, rand(*out_shape, seed=seed + 1), *new]


def vector_eager(x, z, *new):
    return [torch.exp(x).reshape(new) * z]


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("case", list(REGROUPINGS))
def test_vector_reshape_compiles_and_plans_right_strides(case, target):
    fd = vector_reshape()
    inputs = vector_inputs(case, seed=3)
    spec = one_kernel_plan(fd, inputs, target)
    ex = scheduled_by(fd, "pointwise")
    assert [r.scheduler for r in ex.refusals] == ["transpose"]  # no permute: no layouts to tile
    assert REGROUPINGS[case][2] in spec.description
    want = vector_eager(*inputs)
    close(emulate_pointwise(fd, inputs), want)
    close(fd.execute(inputs), want)  # CPU tensors: the reference evaluator


def test_each_regrouping_reads_differently_in_the_plan():
    fd = vector_reshape()
    descriptions = {}
    for case in ("keep", "merge", "split", "mixed", "merge_split"):
        descriptions[case] = one_kernel_plan(fd, vector_inputs(case)).description
    assert len(set(descriptions.values())) == len(descriptions), descriptions
    assert "pointwise" in fd.last_scheduled_fusion_ir().split("scheduler: ")[1]


def test_same_regrouping_other_sizes_reads_the_same():
    fd = vector_reshape()
    first = one_kernel_plan(fd, vector_inputs("merge")).description
    again = one_kernel_plan(fd, [rand(6, 5, 32), rand(30, 32, 1), 30, 32, 1]).description
    assert first.split("; ")[1:] == again.split("; ")[1:]


def test_no_reshape_plans_describe_no_view():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.exp(x) * 2.0)
    spec = one_kernel_plan(fd, [rand(8, 64)])
    assert "reshape" not in spec.description
    assert all(a.frames == () for a in executor_for(fd).program.accesses)


# ---- pointwise: other ways to give sizes, static reshapes, layouts --------------------------


def test_list_of_scalar_handles_with_bias_after_the_reshape():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        b = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Float)
        s0, s1 = fd.define_scalar(dtype=DataType.Int), fd.define_scalar(dtype=DataType.Int)
        y = fd.ops.reshape(x, new_shape=[s0, s1])
        fd.add_output(fd.ops.relu(y + fd.ops.broadcast(b, [True, False])))
    for shape, new in [((6, 40), (6, 40)), ((6, 40), (12, 20)), ((6, 40), (48, 5))]:
        inputs = [rand(*shape, seed=1), rand(new[1], seed=2), *new]
        want = [torch.relu(inputs[0].reshape(new) + inputs[1])]
        one_kernel_plan(fd, inputs)
        scheduled_by(fd, "pointwise")
        close(emulate_pointwise(fd, inputs), want)
        close(fd.execute(inputs), want)


def test_sizes_from_size_ops():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=DataType.Float)
        w = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        rows = fd.ops.mul(fd.ops.size(x, 0), fd.ops.size(x, 1))
        y = fd.ops.reshape(fd.ops.sin(x), [rows, fd.ops.size(x, 2)])
        fd.add_output(y * w)
    x, w = rand(3, 5, 16, seed=4), rand(15, 16, seed=5)
    spec = one_kernel_plan(fd, [x, w])
    scheduled_by(fd, "pointwise")
    assert "merge (0,1)->0" in spec.description
    want = [torch.sin(x).reshape(15, 16) * w]
    close(emulate_pointwise(fd, [x, w]), want)
    close(fd.execute([x, w]), want)


@pytest.mark.parametrize("target", list(TARGETS))
def test_static_reshapes(target):
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[4, 6], contiguity=True, dtype=DataType.Float)
        y = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        a = fd.ops.reshape(fd.ops.neg(x), [2, 12])
        b = fd.ops.reshape(y, [2, -1, 4])
        fd.add_output(fd.ops.reshape(a, [2, 3, 4]) + fd.ops.sigmoid(b))
    x, y = rand(4, 6, seed=6), rand(6, 4, seed=7)
    spec = one_kernel_plan(fd, [x, y], target)
    scheduled_by(fd, "pointwise")
    assert spec.description.count("reshape T") == 3
    want = [(-x).reshape(2, 12).reshape(2, 3, 4) + torch.sigmoid(y.reshape(2, -1, 4))]
    close(emulate_pointwise(fd, [x, y]), want)
    close(fd.execute([x, y]), want)


def test_reshapes_nested_through_a_permute_and_a_second_input():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        m = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=DataType.Float)
        inner = fd.ops.permute(fd.ops.reshape(x, [2, 3, -1]), [1, 0, 2])
        fd.add_output(fd.ops.exp(fd.ops.reshape(inner * m, [3, 2, 2, -1])))
    x, m = rand(2, 24, seed=8), rand(3, 2, 8, seed=9)
    spec = one_kernel_plan(fd, [x, m])
    # a permute of outer dims: the transpose scheduler finds nothing to tile
    program = scheduled_by(fd, "transpose").program
    assert spec.scheduler == "pointwise" and "not tiled" in spec.description
    assert sorted(len(a.frames) for a in program.accesses) == [1, 2]
    want = [torch.exp((x.reshape(2, 3, -1).permute(1, 0, 2) * m).reshape(3, 2, 2, -1))]
    close(emulate_pointwise(fd, [x, m]), want)
    close(fd.execute([x, m]), want)


def test_strided_input_whose_reshape_is_a_view():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)  # any strides
        fd.add_output(fd.ops.reshape(x, [2, 3, -1]) * 3.0)
    x = rand(40, 6, seed=10).t()  # [6, 40], strides (1, 6): splitting dim 0 is a view
    one_kernel_plan(fd, [x])
    want = [x.reshape(2, 3, -1) * 3.0]
    close(emulate_pointwise(fd, [x]), want)
    close(fd.execute([x]), want)


def test_broadcast_inside_a_reshape():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        b = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Float)
        bb = fd.ops.broadcast_in_dim(b, shape=fd.ops.shape(x), broadcast_dims=[1])
        fd.add_output(fd.ops.reshape(x + bb, [fd.ops.size(x, 0), 4, -1]))
    x, b = rand(5, 32, seed=11), rand(32, seed=12)
    one_kernel_plan(fd, [x, b])
    want = [(x + b).reshape(5, 4, -1)]
    close(emulate_pointwise(fd, [x, b]), want)


def plan_refusal(fd, inputs, target="h100"):
    """The SchedulerRefused the taking scheduler's planner raises for these inputs."""
    ex = executor_for(fd)
    env = runtime_shapes(ex.fd, inputs)
    with pytest.raises(SchedulerRefused) as info:
        plan_for(ex.scheduler, ex.program, inputs, env, resolve_target(target))
    return str(info.value)


def test_reshape_that_is_no_view_splits_the_loop():
    """A broadcast dim merged with a real one is not one stride: the loop is split into the
    two (Note [Split loops] in schedulers/loop_split.py) and the fusion stays one kernel."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        b = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Float)
        bb = fd.ops.broadcast_in_dim(b, shape=fd.ops.shape(x), broadcast_dims=[1])
        fd.add_output(fd.ops.exp(fd.ops.reshape(bb, [-1])) + fd.ops.reshape(x, [-1]))
    x, b = rand(4, 6, seed=13), rand(6, seed=14)
    spec = one_kernel_plan(fd, [x, b])
    assert "reshape T" in spec.description and "[4, 6]" not in spec.description
    close(emulate_pointwise(fd, [x, b]), [torch.exp(b.expand(4, 6).reshape(-1)) + x.reshape(-1)])
    close(fd.execute([x, b]), [torch.exp(b.expand(4, 6).reshape(-1)) + x.reshape(-1)])


def test_transposed_input_merged_is_refused_with_both_shapes():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.reshape(fd.ops.exp(x), [-1]))
    x = rand(8, 6, seed=15).t()
    why = plan_refusal(fd, [x])
    assert "reshape (T" in why and "[6, 8] to [48]" in why
    refs = fd.precompile([x], target="h100")  # exp writes a fresh tensor; then it is a view
    assert len(refs) == 2


def test_zero_size_reshape_needs_no_kernel():
    fd = vector_reshape()
    x = rand(0, 4, 8)
    assert fd.precompile([x, rand(4, 0, 8), 4, 0, 8], target="h100") == []
    assert executor_for(fd).last_plan.spec.description.startswith("empty; reshape T")


# ---- reductions -----------------------------------------------------------------------------


def heads_sum(dtype=DataType.Float):
    """x [B, H*D] -> [B, H, D] (H a scalar input), summed over D."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=dtype)
        h = fd.define_scalar(dtype=DataType.Int)
        xf = fd.ops.cast(x, DataType.Float) if dtype is not DataType.Float else x
        y = fd.ops.reshape(xf, [fd.ops.size(x, 0), h, -1])
        fd.add_output(fd.ops.sum(y, [-1]))
    return fd


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("dtype", [DataType.Float, DataType.BFloat16], ids=str)
def test_reduction_with_reshape_prologue(dtype, target):
    fd = heads_sum(dtype)
    x = rand(8, 96, seed=16, dtype=to_torch(dtype))
    spec = one_kernel_plan(fd, [x, 4], target)
    scheduled_by(fd, "reduction")
    assert "reshape T" in spec.description and "split 1->(1,2)" in spec.description
    want = [x.float().reshape(8, 4, -1).sum(-1)]
    close(emulate_reduction(fd, [x, 4]), want)
    close(fd.execute([x, 4]), want)


def test_reduction_plans_differ_by_regrouping():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=DataType.Float)
        sizes = [fd.define_scalar(dtype=DataType.Int) for _ in range(3)]
        fd.add_output(fd.ops.sum(fd.ops.reshape(x, fd.define_vector(sizes)), [-1]))
    seen = set()
    for case in ("keep", "merge", "split", "mixed"):
        shape, new, _ = REGROUPINGS[case]
        x = rand(*shape, seed=17)
        seen.add(one_kernel_plan(fd, [x, *new]).description.split("; ", 1)[1])
        scheduled_by(fd, "reduction")
        want = [x.reshape(new).sum(-1)]
        close(emulate_reduction(fd, [x, *new]), want, tol=1e-4)
        close(fd.execute([x, *new]), want, tol=1e-4)
    assert len(seen) == 4


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.BFloat16], ids=str)
def test_softmax_over_a_reshaped_tensor(dtype):
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=dtype)
        s0, s1 = fd.define_scalar(dtype=DataType.Int), fd.define_scalar(dtype=DataType.Int)
        y = fd.ops.reshape(fd.ops.cast(x, DataType.Float), fd.define_vector([s0, s1]))
        m = fd.ops.broadcast(fd.ops.max(y, [1]), [False, True])
        e = fd.ops.exp(y - m)
        out = e / fd.ops.broadcast(fd.ops.sum(e, [1]), [False, True])
        fd.add_output(fd.ops.cast(out, dtype))
    x = rand(16, 96, seed=18, dtype=to_torch(dtype))
    for new in [(16, 96), (32, 48), (4, 384)]:
        spec = one_kernel_plan(fd, [x, *new])
        scheduled_by(fd, "reduction")
        assert "reshape T" in spec.description
        want = [torch.softmax(x.float().reshape(new), -1).to(x.dtype)]
        tol = 1e-5 if dtype is DataType.Float else 2e-2
        close(emulate_reduction(fd, [x, *new]), want, tol)
        close(fd.execute([x, *new]), want, tol)


def test_outer_reduction_with_reshape_prologue():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        rows = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.sum(fd.ops.reshape(x, [rows, -1]), [0]))
    x = rand(64, 96, seed=19)
    spec = one_kernel_plan(fd, [x, 128])
    scheduled_by(fd, "reduction")
    assert "merge-split" in spec.description
    want = [x.reshape(128, -1).sum(0)]
    close(emulate_reduction(fd, [x, 128]), want, tol=1e-4)
    close(fd.execute([x, 128]), want, tol=1e-4)


def test_reshape_after_a_reduction_is_refused_then_segmented():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        groups = fd.define_scalar(dtype=DataType.Int)
        grouped = fd.ops.reshape(fd.ops.sum(x, [1]), [groups, -1])
        fd.add_output(fd.ops.max(grouped, [1]))
    reasons = {r.scheduler: r.reason for r in executor_for(fd).refusals}
    assert "reshape (T" in reasons["reduction"] and "after a reduction" in reasons["reduction"]
    x = rand(48, 100, seed=20)
    refs = fd.precompile([x, 6], target="h100")
    plan = executor_for(fd).last_plan
    assert len(refs) == 2 and [s.scheduler for s in plan.segments] == ["reduction"] * 2
    close(fd.execute([x, 6]), [x.sum(1).reshape(6, -1).amax(1)], tol=1e-4)


def test_reshape_mixing_reduced_and_kept_dims_is_refused():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.sum(x, [1]))
        fd.add_output(fd.ops.reshape(x * 2.0, [-1]))  # per element, but the shape of a row
    x = rand(8, 16, seed=21)
    scheduled_by(fd, "reduction")
    why = plan_refusal(fd, [x])
    assert "reshape (T" in why and "mixes reduced and kept dims" in why
    assert fd.precompile([x], target="h100")  # segmented instead
    close(fd.execute([x]), [x.sum(1), (x * 2).reshape(-1)])


# ---- errors name the reshape and both shapes --------------------------------------------------


def scalar_reshape():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=DataType.Float)
        sizes = [fd.define_scalar(dtype=DataType.Int) for _ in range(3)]
        fd.add_output(fd.ops.reshape(x, sizes) + 1.0)
    return fd


BAD_SIZES = [
    ((5, 5, 5), "24 elements, but the new shape holds 125"),
    ((-1, -1, 24), "more than one -1"),
    ((-2, 3, 4), "negative size -2"),
    ((5, -1, 2), "24 elements do not divide into parts of 10"),
]


@pytest.mark.parametrize("new,why", BAD_SIZES, ids=[b[1] for b in BAD_SIZES])
def test_run_time_size_errors(new, why):
    fd = scalar_reshape()
    message = rf"reshape \(T4\): cannot reshape \[2, 3, 4\] to \[{', '.join(map(str, new))}\]"
    with pytest.raises(ValueError, match=message) as info:  # CPU: the reference evaluator
        fd.execute([rand(2, 3, 4), *new])
    assert why in str(info.value)
    with pytest.raises(ValueError, match=message) as info:  # planning: the shape evaluator
        fd.precompile([torch.empty(2, 3, 4, device="meta"), *new], target="h100")
    assert why in str(info.value)


def test_size_vector_of_the_wrong_length():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.reshape(x, fd.define_vector(2)))
    x = torch.empty(4, 6, device="meta")
    with pytest.raises(ValueError, match="must have 2 entries"):  # execute checks first
        fd.execute([rand(4, 6), [2, 3, 4]])
    with pytest.raises(ValueError, match=r"reshape \(T2\): cannot reshape \[4, 6\] to "
                                         r"\[2, 3, 4\]: the size vector has 3 entries"):
        evaluate_shapes(fd._records, fd._infos, fd.input_refs(), [x, (2, 3, 4)])
    assert evaluate_shapes(fd._records, fd._infos, fd.input_refs(), [x, (3, -1)])[2] == (3, 8)


def test_sizes_from_a_vector_input_plan_per_vector():
    """A vector input's values are in the plan key (runtime/plans.py input_key), so each
    vector gets its plan and its strides (issue #27: no reference evaluator for these)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.reshape(x, fd.define_vector(2)) * 2.0)
    assert executor_for(fd).scheduler == "pointwise"
    for shape in ([3, 8], [24, 1], [2, 12]):
        spec = one_kernel_plan(fd, [torch.empty(4, 6, device="meta"), shape])
        assert spec.outputs[0].shape == tuple(shape)
    x = rand(4, 6, seed=22)
    close(fd.execute([x, [3, 8]]), [x.reshape(3, 8) * 2.0])


@pytest.mark.parametrize(
    "shape,new,why",
    [([2, 3], [4, 2], "6 elements, but the new shape holds 8"),
     ([2, 3], [-1, -1], "more than one -1"),
     ([2, 3], [2, -3], "negative size -3"),
     ([2, 3], [-1, 4], "6 elements do not divide into parts of 4")],
)  # fmt: skip
def test_definition_time_errors(shape, new, why):
    with pytest.raises(ValueError) as info, FusionDefinition() as fd:
        x = fd.define_tensor(shape=shape, contiguity=True, dtype=DataType.Float)
        fd.ops.reshape(x, new)
    message = str(info.value)
    assert message.startswith("reshape (T1): cannot reshape ") and why in message
    assert str(shape) in message and str(new) in message


def test_shape_evaluator_shapes_reshape_without_torch():
    fd = scalar_reshape()
    x = torch.empty(2, 3, 4, device="meta")
    env = evaluate_shapes(fd._records, fd._infos, fd.input_refs(), [x, 6, -1, 1])
    assert env[4] == (6, 4, 1) and env[6] == (6, 4, 1)


def test_plan_key_holds_vector_input_values():
    # a vector input may size tensors, so two different vectors must not share a plan
    from fusion_cache.runtime.plans import input_key

    x = torch.empty(4, 6)
    assert input_key([x, [4, 6]]) != input_key([x, [3, 8]])
    assert input_key([x, (4, 6)]) == input_key([x, [4, 6]])
