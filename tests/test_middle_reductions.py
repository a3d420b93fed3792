"""Without a GPU: reductions over dims between kept ones take the outer kernel (Note [Middle
reductions] in schedulers/reduction/outer_plan.py), compile for sm_80 and sm_90, and their
plans compute the right values.

No kernel runs here, so each plan is replayed on CPU (`emulate_columns`): the kernel's
arguments give every tensor's strides along the kept and reduced runs; column c's offset
comes from its coordinates along the kept runs and row k's from its coordinates along the
reduced ones, as the kernel computes them; the program's statements then run over the
[rows, columns] values gathered that way and the results go out through the stores' offsets.
"""
import math
import re

import pytest
import torch
from fusion_patterns import define, softmax, standardize
from program_replay import eval_stmts

from fusion_cache import DataType, FusionDefinition
from fusion_cache.frontend.dtypes import from_torch, to_torch
from fusion_cache.ir.shape_eval import runtime_shapes
from fusion_cache.runtime.executor import executor_for
from fusion_cache.runtime.plans import LaunchPlan
from schedulers.base import ArgRef
from schedulers.device import resolve_target
from schedulers.reduction.problem import read_problem
from schedulers.tuning import overriding

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
TOL = {F32: 2e-5, BF16: 1.6e-2, F16: 2e-3}


def rand(shape, dtype=F32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype)


def reduce_stmt(st, x):
    op = dict(st.attrs)["op"]
    if op == "welford":  # (mean, m2, count) over the rows
        x = x.to(to_torch(st.dtype))
        mean = x.mean(0)
        return mean, ((x - mean) ** 2).sum(0), x.shape[0]
    fn = {"sum": torch.sum, "max": torch.amax, "min": torch.amin, "prod": torch.prod}[op]
    return fn(x.to(to_torch(st.compute)), 0).to(to_torch(st.dtype))


def run_columns(program, load, values):
    """The program over [rows, columns] values (`load(k)`); row-level results per column."""
    return eval_stmts(program, lambda k: load(k).to(to_torch(program.accesses[k].dtype)),
                      values, reduce_stmt)  # fmt: skip


def emulate_columns(fd, values, target="h100"):
    """The outputs of the last outer plan, replayed from its kernel's arguments."""
    ex = executor_for(fd)
    program, spec = ex.program, ex.last_plan.spec
    p = read_problem(program, values, runtime_shapes(ex.fd, values), resolve_target(target), (), ())
    args = list(spec.kernels[0].args)
    m, count = len(p.i_sizes), len(program.accesses) + len(program.stores)
    per = 1 + m + 1 + (1 if p.k2 else 0)
    i_strides, ks, k0s = [], [], []
    for t in range(count):
        chunk = args[t * per:(t + 1) * per]
        assert isinstance(chunk[0], ArgRef)
        i_strides.append(chunk[1:1 + m])
        ks.append(chunk[1 + m])
        k0s.append(chunk[2 + m] if p.k2 else 0)
    tail = args[count * per:]
    cols, n = tail[0], tail[1]
    sizes = [cols // math.prod(tail[2:1 + m])] + list(tail[2:1 + m]) if m > 1 else [cols]
    k1 = tail[1 + m] if p.k2 else n
    assert sizes == list(p.i_sizes) and n == p.N
    c = torch.arange(cols)
    coords, rest = [], c
    for d in range(m - 1, 0, -1):
        coords.insert(0, rest % sizes[d])
        rest = rest // sizes[d]
    coords.insert(0, rest)
    k = torch.arange(n)

    def col_off(t):
        return sum(coords[d] * i_strides[t][d] for d in range(m))

    def row_off(t):
        return (k // k1) * k0s[t] + (k % k1) * ks[t]

    def flat(x):
        return x.as_strided((x.untyped_storage().nbytes() // x.element_size(),), (1,), 0)

    def load(i):
        x = values[program.accesses[i].input_pos]
        return flat(x)[row_off(i)[:, None] + col_off(i)[None, :]]

    env = run_columns(program, load, values)
    outs = [torch.zeros(o.shape, dtype=to_torch(o.dtype)) for o in spec.outputs]
    for s, st in enumerate(program.stores):
        t = len(program.accesses) + s
        value = torch.as_tensor(env[st.var]).to(outs[s].dtype)
        if program.store_rowlevel[s]:
            flat(outs[s])[col_off(t)] = value.reshape(-1).expand(cols)
        else:  # along the reduced dim too (a column norm's outputs)
            flat(outs[s])[row_off(t)[:, None] + col_off(t)[None, :]] = value.expand(n, cols)
    return outs


def check(fd, inputs, want, target="h100", kept_runs=None, kernel="fc_outer_reduction"):
    refs = fd.precompile([x.to("meta") if isinstance(x, torch.Tensor) else x for x in inputs],
                         target=target)
    assert refs and refs[0].source.count(f"{kernel}(") == 1
    plan = executor_for(fd).last_plan
    assert isinstance(plan, LaunchPlan) and plan.spec.scheduler == "reduction"
    word = {"fc_outer_reduction": "outer", "fc_column_norm": "column norm"}[kernel]
    assert plan.spec.description.startswith(word), plan.spec.description
    if kept_runs:
        assert f"{kept_runs} kept runs" in plan.spec.description
    got = emulate_columns(fd, inputs, target)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.float(), w.float(), rtol=TOL[w.dtype], atol=TOL[w.dtype])
    for g, w in zip(fd.execute(inputs), want, strict=True):  # CPU: the reference evaluator
        torch.testing.assert_close(g.float(), w.float(), rtol=TOL[w.dtype], atol=TOL[w.dtype])
    return plan.spec


def tensor(fd, rank, dtype):
    return fd.define_tensor(shape=[-1] * rank, contiguity=[True] * rank, dtype=from_torch(dtype))


def up(fd, t, dtype):
    return t if dtype == F32 else fd.ops.cast(t, DataType.Float)


def down(fd, t, dtype):
    return t if dtype == F32 else fd.ops.cast(t, from_torch(dtype))


# ---- [B, R, I] over R -------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["a100", "h100"])
@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("shape", [(4, 96, 64), (3, 50, 37), (2, 1000, 24), (5, 7, 1030)], ids=str)
def test_sum_over_the_middle_dim(shape, dtype, target):
    with FusionDefinition() as fd:
        x = tensor(fd, 3, dtype)
        fd.add_output(down(fd, fd.ops.sum(up(fd, x, dtype), dims=[1]), dtype))
    x = rand(shape, dtype, 1)
    check(fd, [x], [x.float().sum(1).to(dtype)], target, kept_runs=2)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_var_mean_over_the_middle_dim(dtype):
    with FusionDefinition() as fd:
        x = tensor(fd, 3, dtype)
        var, mean = fd.ops.var_mean(up(fd, x, dtype), dims=[1], correction=1)
        fd.add_output(down(fd, var, dtype))
        fd.add_output(down(fd, mean, dtype))
    x = rand((6, 300, 40), dtype, 2)
    var, mean = torch.var_mean(x.float(), dim=1, correction=1)
    check(fd, [x], [var.to(dtype), mean.to(dtype)], kept_runs=2)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_var_mean_over_the_middle_dim_adds_rows_a_group_at_a_time(dtype):
    """Note [Outer Welford add]: the unrolled rows of a column join its Welford state
    together; values far from zero, so a lost deviation would show in the variance."""
    with FusionDefinition() as fd:
        x = tensor(fd, 3, dtype)
        var, mean = fd.ops.var_mean(up(fd, x, dtype), dims=[1], correction=0)
        fd.add_output(down(fd, var, dtype))
        fd.add_output(down(fd, mean, dtype))
    x = (rand((4, 1030, 72), F32, 21) + 50).to(dtype)
    var, mean = torch.var_mean(x.double(), dim=1, correction=0)
    spec = check(fd, [x], [var.to(dtype), mean.to(dtype)], kept_runs=2)
    body = spec.kernels[0].source.split("end prelude")[1]
    assert "fc_welford_add<FC_UNROLL>" in body and "fc_welford_update" in body  # the edges


@pytest.mark.parametrize("shape, threads", [((53, 129, 1000), "16x8"), ((64, 4096, 1024), "16x8"),
                                           ((8, 16384, 4096), "32x8"), ((40, 129, 1000), "32x8")],
                         ids=str)  # fmt: skip
def test_var_mean_of_many_16bit_columns_takes_blocks_of_16_by_8(shape, threads):
    """16-bit Welford columns enough for three blocks an SM (132 on the H100) of 16 x 8
    threads take such blocks; fewer keep 32 x 8 (benchmarks/sweeps/layouts2_r2.json)."""
    with FusionDefinition() as fd:
        x = tensor(fd, 3, BF16)
        var, mean = fd.ops.var_mean(up(fd, x, BF16), dims=[1], correction=0)
        fd.add_output(down(fd, var, BF16))
        fd.add_output(down(fd, mean, BF16))
    fd.precompile([torch.empty(shape, dtype=BF16, device="meta")], target="h100")
    description = executor_for(fd).last_plan.spec.description
    assert description.startswith(f"outer {threads} threads"), description
    if shape[1] == 129:  # and the narrow blocks compute it, rows past the last group too
        x = (rand(shape, F32, 31) + 50).to(BF16)
        var, mean = torch.var_mean(x.double(), dim=1, correction=0)
        check(fd, [x], [var.to(BF16), mean.to(BF16)], kept_runs=2)


@pytest.mark.parametrize("shape, knobs, kernels", [
    ((2, 2048, 2304), {}, 1),  # split 4 in a cluster
    ((2, 2048, 2304), {"outer.cluster": 0}, 2),  # the same split through a finish kernel
    ((2, 4096, 64), {}, 2),  # split 16: wider than a cluster
], ids=["cluster", "finish kernel", "wide split"])  # fmt: skip
def test_split_rows_combine_in_a_cluster_or_a_finish(shape, knobs, kernels):
    with FusionDefinition() as fd:
        x = tensor(fd, 3, F32)
        var, mean = fd.ops.var_mean(x, dims=[1], correction=0)
        fd.add_output(mean)
        fd.add_output(var)
    x = rand(shape, seed=3)
    var, mean = torch.var_mean(x, dim=1, correction=0)
    with overriding(knobs):
        spec = check(fd, [x], [mean, var])
    assert "split 1," not in spec.description
    assert len(spec.kernels) == kernels, spec.description


def test_max_and_a_scaled_sum_with_keepdim():
    with FusionDefinition() as fd:
        x = tensor(fd, 3, F32)
        s = fd.define_scalar(dtype=DataType.Double)
        fd.add_output(fd.ops.max(x, dims=[1], keepdim=True))
        fd.add_output(fd.ops.mul(fd.ops.sum(fd.ops.exp(x), dims=[1], keepdim=True), s))
    x = rand((3, 70, 48), seed=4)
    want = [x.amax(1, keepdim=True), x.exp().sum(1, keepdim=True) * 0.5]
    check(fd, [x, 0.5], want, kept_runs=2)


# ---- relatives: several middle dims, mixed with the first or the last ---------------------------


def test_two_middle_dims_collapse_to_one_run():
    with FusionDefinition() as fd:
        x = tensor(fd, 4, F32)
        fd.add_output(fd.ops.sum(x, dims=[1, 2]))
    x = rand((3, 10, 12, 40), seed=5)
    check(fd, [x], [x.sum((1, 2))], kept_runs=2)


def test_kept_dims_on_three_sides():
    with FusionDefinition() as fd:
        x = tensor(fd, 5, BF16)
        y = fd.ops.sum(fd.ops.cast(x, DataType.Float), dims=[1, 3])
        fd.add_output(fd.ops.cast(y, DataType.BFloat16))
    x = rand((3, 20, 4, 30, 16), BF16, 6)
    spec = check(fd, [x], [x.float().sum((1, 3)).to(BF16)], kept_runs=3)
    assert "two reduced runs" in spec.description


def test_reduced_dims_first_and_in_the_middle():
    with FusionDefinition() as fd:
        x = tensor(fd, 4, F32)
        var, mean = fd.ops.var_mean(x, dims=[0, 2], correction=0)
        fd.add_output(var)
        fd.add_output(mean)
    x = rand((12, 5, 33, 8), seed=7)
    var, mean = torch.var_mean(x, dim=(0, 2), correction=0)
    spec = check(fd, [x], [var, mean], kept_runs=2)
    assert "two reduced runs" in spec.description


def test_reduced_last_dim_stays_a_row_reduction():
    with FusionDefinition() as fd:
        x = tensor(fd, 4, F32)
        fd.add_output(fd.ops.sum(x, dims=[1, 3]))
    fd.precompile([torch.empty(4, 6, 8, 64, device="meta")], target="h100")
    assert executor_for(fd).last_plan.spec.description.startswith("inner")


def test_a_permuted_input_reduced_over_its_contiguous_dim_is_an_outer_reduction():
    with FusionDefinition() as fd:
        x = tensor(fd, 3, F32)
        fd.add_output(fd.ops.sum(fd.ops.permute(x, [0, 2, 1]), dims=[2]))
    x = rand((4, 300, 64), seed=8)
    check(fd, [x], [x.permute(0, 2, 1).sum(2)])


# ---- reductions to a scalar or a few outputs: split rows (Note [Split rows]) ---------------------


def emulate_split(fd, values, target="h100"):
    """The outputs of a split plan: each block's slice as the kernel bounds it, its partial,
    and the partials folded in slice order (sums; Welford by Chan's combine)."""
    ex = executor_for(fd)
    program, spec = ex.program, ex.last_plan.spec
    p = read_problem(program, values, runtime_shapes(ex.fd, values), resolve_target(target), (), ())
    part, finish = spec.kernels
    (split, rows, _), (threads, _, _) = part.grid, part.block
    vec = int(part.source.split("#define FC_VEC ")[1].split()[0])
    step = threads * vec
    n = p.N
    per = (-(-n // step) + split - 1) // split * step
    bounds = [(s * per, min(n, s * per + per)) for s in range(split)]
    covered = torch.zeros(n, dtype=torch.int32)
    for lo, hi in bounds:
        covered[lo:max(lo, hi)] += 1
    assert bool((covered == 1).all()), "the slices must cover every element once"

    def flat(x):
        return x.as_strided((x.untyped_storage().nbytes() // x.element_size(),), (1,), 0)

    outs = [torch.zeros(o.shape, dtype=to_torch(o.dtype)) for o in spec.outputs]
    for r in range(rows):
        def load(i, r=r):
            x = flat(values[program.accesses[i].input_pos])
            k = torch.arange(n)
            return x[r * p.i_strides[i][0] + k * p.ks[i]][:, None]

        loaded = {i: load(i) for i in range(len(program.accesses))}
        parts = []
        for lo, hi in bounds:
            if hi <= lo:
                continue
            env = run_columns(program, lambda i, lo=lo, hi=hi, got=loaded: got[i][lo:hi], values)
            parts.append({red.var: env[red.var] for red in program.reductions})
        env = run_columns(program, loaded.__getitem__, values)  # row-level values, then replaced
        for red in program.reductions:
            env[red.var] = fold(red, [q[red.var] for q in parts])
        env = rerun_row_level(program, env, values)
        for s, st in enumerate(program.stores):
            t = len(program.accesses) + s
            flat(outs[s])[r * p.i_strides[t][0]] = torch.as_tensor(env[st.var]).reshape(-1)[0]
    return outs


def fold(red, parts):
    if red.op != "welford":
        op = {"sum": torch.add, "max": torch.maximum, "min": torch.minimum, "prod": torch.mul}
        acc = parts[0]
        for q in parts[1:]:
            acc = op[red.op](acc, q)
        return acc
    mean, m2, count = parts[0]
    for b_mean, b_m2, b_count in parts[1:]:
        total = count + b_count
        delta = b_mean - mean
        mean = mean + delta * (b_count / total)
        m2 = m2 + b_m2 + delta * delta * count * (b_count / total)
        count = total
    return mean, m2, count


def rerun_row_level(program, env, values):
    """Row-level statements again, from the folded reductions."""
    again = [st for st in program.stmts if st.var not in program.element_vars
             and st.op not in ("reduce", "load", "const", "param")]  # fmt: skip
    return eval_stmts(program, None, values, env=env, stmts=again)


def check_split(fd, inputs, want, target="h100"):
    fd.precompile([x.to("meta") if isinstance(x, torch.Tensor) else x for x in inputs],
                  target=target)  # fmt: skip
    spec = executor_for(fd).last_plan.spec
    assert spec.description.startswith("split rows"), spec.description
    assert [k.name for k in spec.kernels] == ["fc_split_reduction", "fc_outer_finish"]
    assert spec.kernels[1].dependent == (target == "h100")
    for g, w in zip(emulate_split(fd, inputs, target), want, strict=True):
        torch.testing.assert_close(g.float(), w.float(), rtol=TOL[w.dtype], atol=TOL[w.dtype])
    for g, w in zip(fd.execute(inputs), want, strict=True):
        torch.testing.assert_close(g.float(), w.float(), rtol=TOL[w.dtype], atol=TOL[w.dtype])
    return spec


@pytest.mark.parametrize("target", ["a100", "h100"])
@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("n", [2**18, 2**18 + 3], ids=str)
def test_sum_and_mean_to_a_scalar(n, dtype, target):
    with FusionDefinition() as fd:
        x = up(fd, tensor(fd, 1, dtype), dtype)
        total = fd.ops.sum(x, dims=[0])
        fd.add_output(down(fd, total, dtype))
        fd.add_output(down(fd, fd.ops.mul(total, fd.define_scalar(1.0 / n)), dtype))
    x = rand((n,), dtype, 9)
    spec = check_split(fd, [x], [x.float().sum().to(dtype), x.float().mean().to(dtype)], target)
    assert ("vec 1," in spec.description) == (n % 2 == 1)


def test_var_mean_max_of_every_dim():
    with FusionDefinition() as fd:
        x = tensor(fd, 3, F32)
        var, mean = fd.ops.var_mean(x, dims=[0, 1, 2], correction=1)
        fd.add_output(var)
        fd.add_output(mean)
    x = rand((32, 130, 100), seed=10)
    var, mean = torch.var_mean(x, correction=1)
    check_split(fd, [x], [var, mean])
    with FusionDefinition() as fd2:
        y = tensor(fd2, 2, F32)
        fd2.add_output(fd2.ops.max(y, dims=[0, 1]))
    check_split(fd2, [x.view(64, -1)], [x.amax()])


def test_a_few_outputs_with_a_per_row_scale():
    with FusionDefinition() as fd:
        x, s = tensor(fd, 2, BF16), tensor(fd, 1, F32)
        y = fd.ops.mul(fd.ops.cast(x, DataType.Float), fd.ops.broadcast_in_dim(s, fd.ops.shape(x), [0]))
        fd.add_output(fd.ops.sum(y, dims=[1]))
    x, s = rand((3, 200000), BF16, 11), rand((3,), F32, 12)
    spec = check_split(fd, [x, s], [(x.float() * s[:, None]).sum(1)])
    assert spec.kernels[0].grid[1] == 3


def test_many_rows_keep_the_row_kernel():
    with FusionDefinition() as fd:
        x = tensor(fd, 2, F32)
        fd.add_output(fd.ops.sum(x, dims=[1]))
    fd.precompile([torch.empty(64, 2**20, device="meta")], target="h100")
    assert executor_for(fd).last_plan.spec.description.startswith("inner")
    fd.precompile([torch.empty(16, 2**20, device="meta")], target="h100")
    assert executor_for(fd).last_plan.spec.description.startswith("split rows")


# ---- normalizations over a middle dim: column norms (Note [Column norms]) -----------------------


def column_norm_rows(spec):
    """(thread rows, rows a thread, cluster) of a column norm kernel, from its source."""
    src = spec.kernels[0].source
    return tuple(int(src.split(f"#define {name} ")[1].split()[0])
                 for name in ("FC_TY", "FC_RT", "FC_CLUSTER"))  # fmt: skip


@pytest.mark.parametrize("target", ["h100"])
@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("shape", [(4, 256, 64), (3, 1000, 37), (2, 4096, 48), (5, 33, 130)], ids=str)
def test_softmax_over_the_middle_dim(shape, dtype, target):
    fd = define(softmax(dim=1)[0], dtype, 3)
    x = rand(shape, dtype, 13)
    spec = check(fd, [x], [torch.softmax(x.float(), 1).to(dtype)], target, 2, "fc_column_norm")
    ty, rt, cluster = column_norm_rows(spec)
    assert ty * rt * cluster >= shape[1] > ty * (rt - 1) * cluster  # every row, once
    assert spec.kernels[0].grid[0] % cluster == 0


@pytest.mark.parametrize("online", [True, False])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_column_norm_folds_each_columns_partials_once(dtype, online):
    """Note [Column exchange]: one thread a column reads the cluster's partials, all in
    flight, and the block reads the totals from its own shared memory; the outputs are
    stored a row at a time and divisions by a column's sum are multiplications. Softmax's
    max and sum travel through one exchange (Note [Online column softmax])."""
    fd = define(softmax(dim=1)[0], dtype, 3)
    x = rand((3, 4096, 64), dtype, 22)
    plain = {"colnorm.online": online, "colnorm.push": False, "colnorm.persistent": False,
             "colnorm.deep": False, "colnorm.lean": False}
    with overriding(plain):
        spec = check(fd, [x], [torch.softmax(x.float(), 1).to(dtype)], kernel="fc_column_norm")
    assert column_norm_rows(spec)[2] > 1
    body = spec.kernels[0].source.split("end prelude")[1]
    assert body.count("fc_load_remote(") == 2  # max and sum
    assert body.count("fc_cluster_sync();") == (2 if online else 3)  # the last: partials read
    assert body.count("__syncthreads();") == (1 if online else 2) and "total_" in body
    assert "fc_div_by(" in body and " / " not in body.split("fc_divisor_of")[1]
    assert column_norm_rows(spec)[:2] == (32, 8)  # 8 rows of 16 bytes a thread, both dtypes


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_column_norm_clusters_loop_over_tiles_with_the_next_in_flight(dtype):
    """Note [Column tiles in flight]: under the knob, a resident wave of clusters takes
    every so many tiles, loading the next one's rows ahead, exchange buffers alternating;
    softmax (one exchange a tile) and a standardization (Welford: three) compile and replay."""
    fd = define(softmax(dim=1)[0], dtype, 3)
    x = rand((6, 4096, 520), dtype, 23)
    registers = {"colnorm.persistent": True, "colnorm.smem": False}  # rows in smem: below
    with overriding(registers):
        spec = check(fd, [x], [torch.softmax(x.float(), 1).to(dtype)], kernel="fc_column_norm")
    assert "next tile in flight" in spec.description
    cluster = column_norm_rows(spec)[2]
    tiles = -(-6 * 520 // (8 * 32 // (4 if dtype == F32 else 2)))  # 128-byte tiles
    assert spec.kernels[0].grid[0] % cluster == 0 and spec.kernels[0].grid[0] < tiles * cluster
    body = spec.kernels[0].source.split("end prelude")[1]
    assert re.search(r"slot_v\d+_c\[2\]\[FC_CLUSTER\]", body) and "x0_n[it] = fc_load_vec_if" in body
    assert "fc_send_remote(" in body and "fc_load_remote(" not in body  # pushed, no fence
    build, ref = standardize(dim=1)
    fd2 = define(build, F32, 3)
    y = rand((3, 3000, 200), seed=24) * 3 + 1
    with overriding(registers):
        spec = check(fd2, [y], ref(y), kernel="fc_column_norm")
    assert "next tile in flight" in spec.description


@pytest.mark.parametrize("dtype, kind", [(F32, "next tile in flight"), (BF16, "partials pushed")])
def test_column_norm_defaults_loop_over_tiles_in_f32_and_push_in_bf16(dtype, kind):
    """Note [Column tiles in flight]: 32-bit rows loop over tiles; 16-bit ones, which
    took too many registers that way, push their partials (Note [Column exchange]); a
    softmax takes deep tiles instead unless told not to (Note [Whole column tiles])."""
    fd = define(softmax(dim=1)[0], dtype, 3)
    x = rand((32, 4096, 64), dtype, 27)
    with overriding({"colnorm.deep": False}):
        spec = check(fd, [x], [torch.softmax(x.float(), 1).to(dtype)], kernel="fc_column_norm")
    assert kind in spec.description


@pytest.mark.parametrize("knobs", [{}, {"colnorm.vec": 4}, {"colnorm.vec": 4, "colnorm.cluster": 16,
                                                           "colnorm.ty": 32}], ids=str)  # fmt: skip
def test_bf16_column_norm_reads_values_through_their_words(knobs):
    """A bf16 row, in registers or read back from shared memory (16-byte vectors, Note
    [Column rows in smem]), is read a float at a time from its 32-bit words (fc_bf16_at), in
    every pass but the max of rows in smem, which takes the words two columns at a time
    (Note [Lean column softmax]); colnorm.vec narrows the vectors (8-byte ones stay in
    registers)."""
    fd = define(softmax(dim=1)[0], BF16, 3)
    x = rand((3, 1000, 136), BF16, 28)
    with overriding(knobs):
        spec = check(fd, [x], [torch.softmax(x.float(), 1).to(BF16)], kernel="fc_column_norm")
    body = spec.kernels[0].source.split("end prelude")[1]
    in_smem = "colnorm.vec" not in knobs
    assert ("rows in smem" in spec.description) == in_smem
    row = "x0_r" if in_smem else "x0[it]"
    assert body.count(f"fc_bf16_at({row}, j)") == (2 if in_smem else 3) and "fc_to_float(x0" not in body
    assert ("fc_max_bf16x2(" in body) == in_smem
    assert f"#define FC_VEC {knobs.get('colnorm.vec', 8)}" in body


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_softmax_column_norm_keeps_its_exps_under_the_knob(dtype):
    """Note [Online column softmax] under colnorm.reuse_exp: the output pass takes exp(x - M)
    as the sum pass's exp(x - m_b) times the column's exp(m_b - M), one exp an element in
    all, a block of -inf rows giving 0."""
    fd = define(softmax(dim=1)[0], dtype, 3)
    x = rand((3, 4096, 64), dtype, 29)
    with overriding({"colnorm.reuse_exp": True}):
        spec = check(fd, [x], [torch.softmax(x.float(), 1).to(dtype)], kernel="fc_column_norm")
    assert "exps kept" in spec.description
    body = spec.kernels[0].source.split("end prelude")[1]
    out_pass = body.split("_b_f[j] = exp2f(")[1]
    assert "exp2f(" not in out_pass and re.search(r"v\d+_e\[it\]\[j\] \* v\d+_b_f\[j\]", out_pass)


@pytest.mark.parametrize("dtype, knobs, tx, blocks", [(BF16, {"colnorm.deep": False}, 4, 4),
                                                     (BF16, {"colnorm.smem": False}, 8, 3),
                                                     (F32, {"colnorm.deep": False}, 8, 0)],
                         ids=str)  # fmt: skip
def test_column_norm_blocks_and_the_blocks_an_sm_they_ask_for(dtype, knobs, tx, blocks):
    """Without deep tiles (Note [Whole column tiles]): 16-bit rows go to shared memory (Note
    [Column rows in smem]) in blocks of 4x32 threads (64-byte rows) asking for four an SM;
    kept in registers, in blocks of 256 threads asking for three (80 registers, three blocks
    an SM instead of two); 32-bit ones loop over tiles and leave it unset."""
    fd = define(softmax(dim=1)[0], dtype, 3)
    with overriding(knobs):
        fd.precompile([torch.empty((32, 4096, 512), dtype=dtype, device="meta")], target="h100")
    spec = executor_for(fd).last_plan.spec
    kernel = spec.kernels[0]
    assert kernel.block == (tx, 32, 1) and column_norm_rows(spec) == (32, 8, 16)
    assert ("rows in smem" in spec.description) == (dtype == BF16 and "colnorm.smem" not in knobs)
    bounds = f"__launch_bounds__({tx * 32}, {blocks})" if blocks else f"__launch_bounds__({tx * 32})"
    assert bounds in kernel.source and (f"{blocks} blocks/SM" in spec.description) == bool(blocks)


@pytest.mark.parametrize("end_sync", [None, True])
def test_column_norm_partials_pushed_through_mbarriers(end_sync):
    """Note [Column exchange] under colnorm.push: one tile a cluster, partials sent with
    st.async to every peer; softmax and a standardization compile and replay. A block has
    every peer's partials once its mbarrier completes, so no cluster barrier precedes its
    exit (colnorm.end_sync puts it back)."""
    knobs = {"colnorm.push": True, "colnorm.persistent": False}
    if end_sync is not None:
        knobs["colnorm.end_sync"] = end_sync
    for build, ref, x in [(softmax(dim=1)[0], lambda x: [torch.softmax(x, 1)], rand((3, 4096, 64), seed=25)),
                          (*standardize(dim=1), rand((3, 3000, 200), seed=26) * 3 + 1)]:  # fmt: skip
        fd = define(build, F32, 3)
        with overriding(knobs):
            spec = check(fd, [x], ref(x), kernel="fc_column_norm")
        assert "partials pushed" in spec.description
        body = spec.kernels[0].source.split("end prelude")[1]
        assert "fc_send_remote(" in body and "fc_load_remote(" not in body
        assert body.count("fc_cluster_sync();") == (1 if end_sync else 0)


def test_layer_norm_like_over_the_middle_dim_and_its_statistics():
    build, ref = standardize(dim=1)
    fd = define(build, F32, 3)
    x = rand((3, 500, 40), seed=14) * 3 + 1
    check(fd, [x], ref(x), kernel="fc_column_norm")


def test_softmax_over_the_first_dim_of_many_columns():
    fd = define(softmax(dim=0)[0], F32, 2)
    x = rand((300, 520), seed=15)
    check(fd, [x], [torch.softmax(x, 0)], kernel="fc_column_norm")


def test_knobs_and_a_reduced_dim_too_long_for_a_cluster():
    fd = define(softmax(dim=1)[0], F32, 3)
    x = rand((2, 600, 64), seed=16)
    with overriding({"colnorm.cluster": 2, "colnorm.ty": 64}):
        spec = check(fd, [x], [torch.softmax(x, 1)], kernel="fc_column_norm")
    assert column_norm_rows(spec) == (64, 5, 2)
    fd.precompile([torch.empty(2, 200000, 64, device="meta")], target="h100")
    plan = executor_for(fd).last_plan
    assert not isinstance(plan, LaunchPlan)  # segmented: a reduction and pointwise kernels


# ---- permuted inputs -------------------------------------------------------------------------


def test_softmax_of_a_transposed_input_reads_it_along_columns():
    with FusionDefinition() as fd:
        x = tensor(fd, 3, F32)
        xt = fd.ops.permute(x, [0, 2, 1])  # [B, I, R]: softmax over R, strided in x
        shape = fd.ops.shape(xt)
        mx = fd.ops.broadcast_in_dim(fd.ops.max(xt, dims=[2]), shape, [0, 1])
        e = fd.ops.exp(fd.ops.sub(xt, mx))
        fd.add_output(fd.ops.div(e, fd.ops.broadcast_in_dim(fd.ops.sum(e, dims=[2]), shape, [0, 1])))
    x = rand((3, 200, 64), seed=17)
    spec = check(fd, [x], [torch.softmax(x.permute(0, 2, 1), 2)], kernel="fc_column_norm")
    # the output runs along the reduced dim: stored a value at a time
    body = spec.kernels[0].source.split("end prelude")[1]
    assert "fc_store_vec_hint" not in body and "fc_load_vec_if" in body


def test_a_row_reduction_of_a_transposed_and_a_plain_input_compiles_and_runs():
    with FusionDefinition() as fd:
        x, y = tensor(fd, 2, F32), tensor(fd, 2, F32)
        fd.add_output(fd.ops.sum(fd.ops.mul(x, fd.ops.permute(y, [1, 0])), dims=[1]))
    x, y = rand((96, 160), seed=18), rand((160, 96), seed=19)
    fd.precompile([x.to("meta"), y.to("meta")], target="h100")
    assert executor_for(fd).last_plan.spec.description.startswith("inner")
    torch.testing.assert_close(fd.execute([x, y])[0], (x * y.t()).sum(1))


def test_column_norms_without_clusters_take_short_reduced_dims():
    fd = define(softmax(dim=1)[0], F32, 3)
    x = rand((3, 200, 64), seed=20)
    spec = check(fd, [x], [torch.softmax(x, 1)], "a100", kernel="fc_column_norm")
    assert column_norm_rows(spec)[2] == 1
    fd.precompile([torch.empty(2, 4096, 64, device="meta")], target="a100")
    assert not isinstance(executor_for(fd).last_plan, LaunchPlan)  # too long for one block


def test_a_softmax_over_a_middle_dim_of_a_pad_plans_and_compiles():
    """The column kernel renders no window guards: a pad before a middle-dim softmax (as
    GPT-2's backward made on the H100) planned it there and failed with KeyError: None."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=DataType.Float)
        s = fd.ops.pad(x, [0, 0, 1, 2])
        e = fd.ops.exp(fd.ops.sub(s, fd.ops.max(s, [1], keepdim=True)))
        fd.add_output(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)))
    assert fd.precompile([torch.empty(64, 40, 32, device="meta")], target="h100")
    x = torch.randn(6, 5, 4)
    (got,) = fd.execute([x])
    torch.testing.assert_close(got, torch.softmax(torch.nn.functional.pad(x, [0, 0, 1, 2]), 1))


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_column_norm_rows_in_smem_under_the_knob(dtype, persistent):
    """Note [Column rows in smem] under colnorm.smem: each thread copies its rows to its own
    shared-memory slots with cp.async (two buffers where clusters loop over tiles) and reads
    them back in every pass; no row stays in registers. Softmax and a standardization
    (Welford: three passes) compile and replay, tails of rows and columns included."""
    knobs = {"colnorm.smem": True, "colnorm.persistent": persistent, "colnorm.deep": False}
    fd = define(softmax(dim=1)[0], dtype, 3)
    x = rand((5, 4000, 136), dtype, 31)
    with overriding(knobs):
        spec = check(fd, [x], [torch.softmax(x.float(), 1).to(dtype)], kernel="fc_column_norm")
    assert "rows in smem" in spec.description
    assert ("next tile in flight" in spec.description) == persistent
    kernel = spec.kernels[0]
    ty, rt, _ = column_norm_rows(spec)
    assert kernel.shared_mem == kernel.block[0] * ty * rt * 16 * (2 if persistent else 1)
    body = kernel.source.split("end prelude")[1]
    assert body.count("fc_cp_async16(") == (2 if persistent else 1)
    assert "x0[it]" not in body and "x0_n" not in body
    assert body.count("fc_cp_async_wait<") == 1
    build, ref = standardize(dim=1)
    fd2 = define(build, dtype, 3)
    y = (rand((3, 3000, 200), seed=32) * 3 + 1).to(dtype)
    with overriding(knobs):
        spec = check(fd2, [y], ref(y), kernel="fc_column_norm")
    assert "rows in smem" in spec.description


# ---- Note [Whole column tiles] ---------------------------------------------------------------

WHOLE = {"colnorm.cluster": 1, "colnorm.tx": 1, "colnorm.ty": 256, "colnorm.smem": True,
         "colnorm.min_blocks": 3, "colnorm.persistent": False}


@pytest.mark.parametrize("more", [{}, {"colnorm.chunks": 4}, {"colnorm.refill": True},
                                  {"colnorm.chunks": 4, "colnorm.refill": True},
                                  {"colnorm.chunks": 16, "colnorm.refill": True, "colnorm.tx": 2,
                                   "colnorm.min_blocks": 1},
                                  {"colnorm.cluster": 4, "colnorm.tx": 4, "colnorm.ty": 64,
                                   "colnorm.chunks": 4, "colnorm.refill": True},
                                  {"colnorm.cluster": 4, "colnorm.tx": 4, "colnorm.ty": 64,
                                   "colnorm.chunks": 4}], ids=str)  # fmt: skip
@pytest.mark.parametrize("dtype", [F32, BF16, F16])
def test_whole_column_tiles_under_the_knobs(dtype, more):
    """Note [Whole column tiles]: one block holds a tile's whole reduced dim in shared
    memory, no cluster (or a cluster's blocks a share of it each); its copies land in groups
    that softmax's one first pass waits for in turn (colnorm.chunks), the blocks' (max, sum)
    pairs then exchanged in one go, and blocks looping over tiles refill each slot with the
    next tile's row once its output is written (colnorm.refill). Softmax, log-softmax and a
    standardization (Welford: no chunked pass, one wait) compile and replay, tails of rows
    (4000 and 1000 rows over 256 thread rows) and of columns included."""
    knobs = {**WHOLE, **more}
    chunks, refill = knobs.get("colnorm.chunks", 0), knobs.get("colnorm.refill", False)
    for shape, log in [((5, 4000, 136), False), ((3, 1000, 40), False), ((3, 1000, 1000), True)]:
        build, ref = softmax(log=log, dim=1)
        fd = define(build, dtype, 3)
        x = rand(shape, dtype, 33)
        with overriding(knobs):
            spec = check(fd, [x], [ref(x)], kernel="fc_column_norm")
        kernel = spec.kernels[0]
        ty, rt, cluster = column_norm_rows(spec)
        assert cluster == knobs["colnorm.cluster"]
        assert ("__cluster_dims__" in kernel.source) == (cluster > 1)
        assert "rows in smem" in spec.description and ("refilled" in spec.description) == refill
        groups = -(-rt // -(-rt // chunks)) if chunks else 1
        body = kernel.source.split("end prelude")[1]
        assert body.count("fc_cp_async_wait<") == groups
        assert body.count("fc_cp_async_commit();") == 1 + refill  # the first copies, the refills
        assert kernel.shared_mem == kernel.block[0] * ty * rt * 16
        tiles = -(-math.prod(shape[::2]) // (kernel.block[0] * 16 // x.element_size()))
        wave = resolve_target("h100").resident_clusters(cluster, knobs["colnorm.min_blocks"])
        # refilled: one wave, of as many blocks an SM as asked for or their smem lets fit
        assert kernel.grid[0] % cluster == 0
        assert (kernel.grid[0] <= min(tiles, wave) * cluster) if refill else (
            kernel.grid[0] == tiles * cluster)  # fmt: skip
        # the blocks' pairs go through one exchange, pushed where the clusters loop (and by
        # default for 16-bit rows, Note [Column exchange])
        sent, loaded = body.count("fc_send_remote("), body.count("fc_load_remote(")
        assert sent + loaded == (2 if cluster > 1 else 0) and (sent == 2) == (cluster > 1 and (
            refill or dtype != F32))  # fmt: skip
        assert ("col_next" in body) == refill and "fc_fold_rows" in body
    build, ref = standardize(dim=1)
    fd2 = define(build, dtype, 3)
    y = (rand((3, 3000, 200), seed=34) * 3 + 1).to(dtype)
    with overriding(knobs):
        spec = check(fd2, [y], ref(y), kernel="fc_column_norm")
    body = spec.kernels[0].source.split("end prelude")[1]
    assert "rows in smem" in spec.description and body.count("fc_cp_async_wait<0>") == 1


@pytest.mark.parametrize("dtype", [F32, BF16, F16])
def test_softmax_over_a_long_middle_dim_takes_deep_tiles(dtype):
    """Note [Whole column tiles]: softmax (and log-softmax) over 4096 rows, which took
    clusters of 16, takes tiles of 128-byte rows (64 columns of 16-bit values, 32 of 32-bit
    ones), 256 threads a block holding 16 rows a thread in shared memory, copied in four
    groups, asking for three blocks an SM, in clusters of 8 pushing their partials, the
    softmax lean (Note [Lean column softmax]) and the row fold's shared memory small enough
    for the three blocks; a standardization (Welford) and a short reduced dim keep their
    plans."""
    knobs: dict = {}
    fd = define(softmax(dim=1)[0], dtype, 3)
    with overriding({"colnorm.deep": False}):  # the other plan
        fd.precompile([torch.empty((32, 4096, 512), dtype=dtype, device="meta")], target="h100")
    assert "chunks" not in executor_for(fd).last_plan.spec.description
    fd = define(softmax(dim=1)[0], dtype, 3)
    fd.precompile([torch.empty((32, 4096, 512), dtype=dtype, device="meta")], target="h100")
    spec = executor_for(fd).last_plan.spec
    kernel, vec = spec.kernels[0], 16 // dtype.itemsize
    assert kernel.block == (8, 32, 1) and column_norm_rows(spec) == (32, 16, 8)
    assert "rows in smem, 4 chunks, lean, 3 blocks/SM" in spec.description
    assert "partials pushed" in spec.description
    assert kernel.shared_mem == 64 * 1024 and "next tile in flight" not in spec.description
    assert kernel.grid[0] == 32 * 512 // (8 * vec) * 8
    body = kernel.source.split("end prelude")[1]
    # Note [Row fold]: 4 columns a round (5 KB; all 4 of a 32-bit vector) where 8 (9 KB)
    # left 16-bit rows two blocks an SM
    assert "fc_fold_rows<FC_TX, FC_TY, FC_VEC, 4>" in body
    assert "fc_cluster_sync();" not in body  # Note [Column exchange]: pushed, no end barrier
    for shape, log in [((3, 4000, 72), False), ((2, 2048, 40), True)]:
        build, ref = softmax(log=log, dim=1)
        fd = define(build, dtype, 3)
        x = rand(shape, dtype, 35)
        with overriding(knobs):
            spec = check(fd, [x], [ref(x)], kernel="fc_column_norm")
        assert "4 chunks" in spec.description, spec.description
    build, ref = standardize(dim=1)
    fd2 = define(build, dtype, 3)
    y = (rand((3, 4096, 40), seed=36) * 3 + 1).to(dtype)
    with overriding(knobs):
        spec = check(fd2, [y], ref(y), kernel="fc_column_norm")
    assert "chunks" not in spec.description
    fd3 = define(softmax(dim=1)[0], dtype, 3)
    z = rand((3, 300, 40), dtype, 37)
    with overriding(knobs):
        spec = check(fd3, [z], [torch.softmax(z.float(), 1).to(dtype)], kernel="fc_column_norm")
    assert "chunks" not in spec.description and column_norm_rows(spec)[2] < 8


# ---- Note [Lean column softmax] --------------------------------------------------------------


@pytest.mark.parametrize("target", ["a100", "h100"])
@pytest.mark.parametrize("dtype", [F32, BF16, F16])
def test_lean_chunked_column_softmax(dtype, target):
    """Note [Lean column softmax]: the chunked softmax pass takes a bf16 column's max two
    columns an instruction, its sum's terms flushed, and the output as one biased exp2 with
    no division, of x - M for 32-bit outputs and of x alone for 16-bit ones (M in the
    constant); log-softmax (its x - m read by the output too) keeps its own output pass.
    Tails of rows and columns included."""
    knobs = {**WHOLE, "colnorm.chunks": 4, "colnorm.lean": True, "colnorm.deep": False}
    if target == "h100":
        knobs.update({"colnorm.cluster": 4, "colnorm.tx": 4, "colnorm.ty": 64})
    for shape, log in [((3, 4000, 72), False), ((2, 2048, 40), True), ((5, 1000, 136), False)]:
        build, ref = softmax(log=log, dim=1)
        fd = define(build, dtype, 3)
        x = rand(shape, dtype, 37)
        with overriding(knobs):
            spec = check(fd, [x], [ref(x)], target=target, kernel="fc_column_norm")
        body = spec.kernels[0].source.split("end prelude")[1]
        assert "lean" in spec.description, spec.description
        assert ("fc_max_bf16x2(" in body) == (dtype == BF16)
        assert body.count("fc_exp2_flushed(fmaf(") == 4  # one sum pass a group
        assert ("fc_exp2_biased(" in body) == (not log) and "fc_divisor_of" not in body
        assert bool(re.search(r"fc_exp2_biased\(fmaf\(\w+ - \w+,", body)) == (dtype == F32 and not log)
    with overriding({**knobs, "colnorm.lean": False}):
        fd = define(softmax(dim=1)[0], dtype, 3)
        spec = check(fd, [x], [ref(x)], target=target, kernel="fc_column_norm")
    body = spec.kernels[0].source.split("end prelude")[1]
    assert "lean" not in spec.description and "fc_exp2_biased(" not in body


def test_biased_exp2_keeps_the_subnormal_outputs():
    """Note [Lean column softmax]: 2^((x - M)*log2(e) - log2(S) + 64) flushed below 2^-126 and
    scaled by 2^-64 is exp(x - M) / S, subnormal results included, within a few float ulp."""
    x = torch.cat([torch.linspace(-120.0, 0.0, 4001), torch.tensor([-103.0, -95.0, -88.0])])
    s = torch.tensor(7.5)
    want = (torch.exp(x.double()) / s.double()).float()
    y = torch.addcmul(64.0 - torch.log2(s), x, torch.tensor(1.4426950408889634))
    e = torch.exp2(y)
    got = torch.where(y < -126, 0.0, e) * 2.0**-64
    assert (want[x > -100] > 0).all() and (want < 1.2e-38).any()  # subnormals in range
    torch.testing.assert_close(got, want, rtol=4e-6, atol=2.0**-149 * 2)
