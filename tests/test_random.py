"""Random numbers (Note [Philox numbers], Note [Random seeds]): Philox 4x32-10 against its
published answers, the reference's numbers against the definition of the note, their
independence of shape and process, fresh numbers each execute, distributions on 10^6
samples (mean, variance, Kolmogorov-Smirnov) in float and bf16, and the kernels and plans
they get for the h100 profile. tests/gpu checks the kernels against the same reference."""
import math
import re
import subprocess
import sys

import pytest
import torch
from aten_patterns import dropout_residual_layer_norm, dropout_residual_layer_norm_backward
from test_runtime_errors import cpu_as_gpu  # noqa: F401 - the GPU path on the CPU

from fusion_cache import DataType, FusionDefinition
from fusion_cache.frontend.dtypes import from_torch
from fusion_cache.ir.interpret.random import philox4x32_10
from fusion_cache.ir.random_seeds import unseeded_ops, with_seed_inputs
from fusion_cache.runtime.executor import executor_for

SAMPLES = 10**6


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def seeded(dist, shape, dtype=DataType.Float, a=0.0, b=1.0):
    """A fusion drawing `dist` numbers of `shape` from seed and offset inputs."""
    with FusionDefinition() as fd:
        seed = fd.define_scalar(dtype=DataType.Int)
        offset = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(getattr(fd.ops, dist)(a, b, shape, rng_seed=seed, rng_offset=offset,
                                            dtype=dtype))  # fmt: skip
    return fd


# ---- the generator ------------------------------------------------------------------------


@pytest.mark.parametrize("counter,key,expected", [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])  # fmt: skip
def test_philox_matches_random123_known_answers(counter, key, expected):
    group = counter[0] | counter[1] << 32
    group = torch.tensor([group - 2**64 if group >= 2**63 else group])
    words = philox4x32_10(key[0] | key[1] << 32, counter[2] | counter[3] << 32, group)
    assert tuple(int(w[0]) & 0xFFFFFFFF for w in words) == expected


def test_uniform_follows_the_note_word_for_word():
    (u,) = seeded("uniform", [10]).execute([123, 45])
    words = philox4x32_10(123, 45, torch.arange(3))
    for i in range(10):
        w = int(words[i & 3][i >> 2])
        assert u[i].item() == (w >> 8) * 2.0**-24


# ---- reproducibility ----------------------------------------------------------------------


@pytest.mark.parametrize("dist", ["uniform", "normal"])
@pytest.mark.parametrize("dtype", [DataType.Float, DataType.Double, DataType.BFloat16])
def test_numbers_depend_on_seed_offset_and_index_alone(dist, dtype):
    (flat,) = seeded(dist, [1000], dtype).execute([7, 3])
    (grid,) = seeded(dist, [10, 10, 10], dtype).execute([7, 3])
    (short,) = seeded(dist, [37], dtype).execute([7, 3])
    assert torch.equal(flat.reshape(10, 10, 10), grid) and torch.equal(flat[:37], short)
    (other_offset,) = seeded(dist, [1000], dtype).execute([7, 4])
    (other_seed,) = seeded(dist, [1000], dtype).execute([8, 3])
    assert (flat != other_offset).float().mean() > 0.9 and (flat != other_seed).float().mean() > 0.9


def test_a_new_process_draws_the_same_numbers(tmp_path):
    (here,) = seeded("normal", [64], DataType.Float, 1.0, 2.0).execute([2**40 + 5, 11])
    script = (
        "import torch\n"
        "from fusion_cache import DataType, FusionDefinition\n"
        "with FusionDefinition() as fd:\n"
        "    s = fd.define_scalar(dtype=DataType.Int); o = fd.define_scalar(dtype=DataType.Int)\n"
        "    fd.add_output(fd.ops.normal(1.0, 2.0, [64], rng_seed=s, rng_offset=o))\n"
        f"torch.save(fd.execute([{2**40 + 5}, 11])[0], {str(tmp_path / 'n.pt')!r})\n"
    )
    env = {"FUSION_CACHE_DIR": str(tmp_path / "store"), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=120)
    assert torch.equal(torch.load(tmp_path / "n.pt"), here)


def test_without_a_seed_each_execute_draws_new_numbers_and_manual_seed_repeats_them():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True)
        fd.add_output(fd.ops.rand_like(x))
        fd.add_output(fd.ops.randn_like(x))
        fd.add_output(fd.ops.uniform(-1.0, 1.0, fd.ops.shape(x)))
    x = torch.zeros(50, 40)
    torch.manual_seed(0)
    first = fd.execute([x])
    second = fd.execute([x])
    torch.manual_seed(0)
    again = fd.execute([x])
    for a, b, c in zip(first, second, again):
        assert torch.equal(a, c) and (a != b).float().mean() > 0.99
    assert (first[0] != first[2]).float().mean() > 0.99  # two ops, two streams


def test_explicit_seeds_take_the_same_numbers_on_the_gpu_path(cpu_as_gpu):  # noqa: F811
    """The GPU path on the CPU (plans for the h100 profile, kernels run by the reference):
    the numbers of an explicit seed are the reference's."""
    fd = seeded("uniform", [4, 300], DataType.BFloat16, -2.0, 3.0)
    (gpu_path,) = fd.execute([99, 8])
    (plan,) = executor_for(fd).plans.values()
    assert plan.spec.kernels
    (reference,) = seeded("uniform", [1200], DataType.BFloat16, -2.0, 3.0).execute([99, 8])
    assert torch.equal(gpu_path.flatten(), reference)


# ---- distributions ------------------------------------------------------------------------


def ks_statistic(samples: torch.Tensor, cdf) -> float:
    """Kolmogorov-Smirnov distance between the samples and `cdf`, taking their rounding to
    their dtype into account: a value v stands for every real number that rounds to it, so
    the theoretical CDF at v is cdf at the midpoint to the next representable value."""
    values, counts = torch.unique(samples, sorted=True, return_counts=True)
    empirical = torch.cumsum(counts, 0).double() / samples.numel()
    nxt = torch.nextafter(values, torch.full_like(values, math.inf))
    mid = (values.double() + nxt.double()) / 2
    theory = cdf(mid)
    before = torch.cat([torch.zeros(1, dtype=torch.float64), empirical[:-1]])
    below = torch.cat([torch.zeros(1, dtype=torch.float64), theory[:-1]])
    return max((empirical - theory).abs().max().item(), (before - below).abs().max().item())


def normal_cdf(x):
    return 0.5 * (1 + torch.erf(x / math.sqrt(2)))


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.BFloat16], ids=str)
@pytest.mark.parametrize("dist", ["uniform", "normal"])
def test_distributions_of_a_million_samples(dist, dtype):
    a, b = (-3.0, 5.0) if dist == "uniform" else (2.0, 0.5)
    (x,) = seeded(dist, [SAMPLES], dtype, a, b).execute([2024, 0])
    x = x.double()
    if dist == "uniform":
        mean, var = (a + b) / 2, (b - a) ** 2 / 12
        cdf = lambda v: ((v - a) / (b - a)).clamp(0, 1)  # noqa: E731
        assert x.min() >= a and (x.max() < b or dtype is DataType.BFloat16)
    else:
        mean, var = a, b**2
        cdf = lambda v: normal_cdf((v - a) / b)  # noqa: E731
    # 5 standard errors of the mean and of the variance
    assert abs(x.mean().item() - mean) < 5 * math.sqrt(var / SAMPLES)
    assert abs(x.var().item() - var) < 5 * var * math.sqrt(2 / SAMPLES) + (
        (b - a) ** 2 / 2**18 if dtype is DataType.BFloat16 else 0)  # fmt: skip
    # the KS critical value at 0.1%: 1.95 / sqrt(n)
    assert ks_statistic(x.to(torch.float32 if dtype is DataType.Float else torch.bfloat16),
                        cdf) < 1.95 / math.sqrt(SAMPLES)  # fmt: skip


def test_ks_statistic_catches_a_wrong_distribution():
    (x,) = seeded("uniform", [SAMPLES], DataType.Float).execute([1, 0])
    assert ks_statistic(x**1.05, lambda v: v.clamp(0, 1)) > 1.95 / math.sqrt(SAMPLES)


# ---- definitions and schedules ------------------------------------------------------------


def test_definition_errors_and_printing():
    with FusionDefinition() as fd:
        s = fd.define_scalar(dtype=DataType.Int)
        with pytest.raises(TypeError, match="rng_seed and rng_offset must be given together"):
            fd.ops.uniform(0.0, 1.0, [4], rng_seed=s)
        with pytest.raises(TypeError, match="floating point"):
            fd.ops.normal(0.0, 1.0, [4], dtype=DataType.Int)
        t = fd.ops.uniform(0.0, 1.0, [4, 5], rng_seed=s, rng_offset=s, dtype=DataType.Half)
        fd.add_output(t)
    assert t.dtype is DataType.Half and t._info().shape == (4, 5)
    assert re.search(r"fd.ops.uniform\(S\d+, S\d+, \[4, 5\], rng_seed=S0, rng_offset=S0, "
                     r"dtype=DataType.Half\)", repr(fd))  # fmt: skip


def test_unseeded_ops_read_the_run_seed_inputs():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1], contiguity=True)
        fd.add_output(fd.ops.add(fd.ops.rand_like(x), fd.ops.normal(0.0, 1.0, [5])))
    assert unseeded_ops(fd) == 2
    sched = with_seed_inputs(fd)
    assert len(sched.input_refs()) == 3 and unseeded_ops(sched) == 0
    ops = [r for r in sched._records if r.kind == "op" and r.name in ("uniform", "normal")]
    assert [r.name for r in ops] == ["uniform", "normal"]
    assert ops[0].kw("rng_offset") == sched.input_refs()[1]  # the first takes the offset itself
    assert ops[1].kw("rng_offset") != ops[0].kw("rng_offset")  # the second offset + 1


def test_dropout_residual_layer_norm_is_one_kernel_forward_and_backward():
    fd = dropout_residual_layer_norm(0.1)
    n, c = 16384, 4096
    refs = fd.precompile([meta(n, c), meta(n, c), meta(c), meta(c)], target="h100")
    ex = executor_for(fd)
    assert ex.scheduler == "reduction" and len(refs) == 1 and "fc_rng_uniform" in refs[0].source
    bwd = dropout_residual_layer_norm_backward(0.1)
    refs = bwd.precompile([meta(n, c), meta(n, c), meta(n, c), meta(n, c, dtype=torch.bool),
                           meta(n, 1, dtype=torch.float32), meta(n, 1, dtype=torch.float32),
                           meta(c)], target="h100")  # fmt: skip
    assert executor_for(bwd).scheduler == "inner_outer" and len(refs) == 1


def test_dropout_layer_norm_row_fits_three_blocks_an_sm():
    """Note [Random rows in registers]: the row kernel keeps x, h and its sums in 16 values a
    thread and draws by lane; it asks three blocks of 512 threads an SM, and ptxas fits it in
    40 registers with at most a few bytes spilled (64 and two blocks before)."""
    from codegen.nvrtc import compile_cubin_with_log, default_options

    fd = dropout_residual_layer_norm(0.1)
    n, c = 16384, 4096
    (ref,) = fd.precompile([meta(n, c), meta(n, c), meta(c), meta(c)], target="h100")
    (launch,) = executor_for(fd).last_plan.spec.kernels
    assert launch.block[0] * launch.block[1] == 512
    description = executor_for(fd).last_plan.spec.description
    assert "iters 2" in description and "3 blocks/SM" in description, description
    assert "__launch_bounds__(512, 3)" in launch.source
    _, log = compile_cubin_with_log(launch.source, 90, name=launch.name,
                                    options=default_options(90) + ("-Xptxas=-v",))  # fmt: skip
    assert int(re.search(r"Used (\d+) registers", log).group(1)) <= 40, log
    assert int(re.search(r"(\d+) bytes spill stores", log).group(1)) <= 16, log


@pytest.mark.parametrize("c,lanes", [(4096, True), (5000, True), (1002, False)])
def test_row_kernels_draw_by_lane_where_vectors_start_groups(c, lanes):
    """Note [Philox lanes]: rows of a multiple of 4 in vectors of 8 draw by lane and pick
    their words by place, others compare each element's group (both compile for the h100);
    with the knob off every row compares."""
    from schedulers.tuning import overriding

    fd = dropout_residual_layer_norm(0.1)
    fd.precompile([meta(64, c), meta(64, c), meta(c), meta(c)], target="h100")
    (launch,) = executor_for(fd).last_plan.spec.kernels
    assert ("Philox lanes" in executor_for(fd).last_plan.spec.description) == lanes
    assert ("#define FC_ELEM_LANE (j)" if lanes else "#define FC_ELEM_LANE (-1)") in launch.source
    executor_for(fd).plans.clear()
    with overriding({"inner.rng_lanes": False}):
        fd.precompile([meta(64, c), meta(64, c), meta(c), meta(c)], target="h100")
    assert "Philox lanes" not in executor_for(fd).last_plan.spec.description


def test_dropout_layer_norm_stores_its_mask_where_it_draws():
    """Note [Stores in the first pass]: the keep mask no reduction feeds is stored by the pass
    that draws it, before the row's first block reduction; the uniforms are carried to no
    later pass, and the last pass stores y alone."""
    fd = dropout_residual_layer_norm(0.1)
    fd.precompile([meta(64, 4096), meta(64, 4096), meta(4096), meta(4096)], target="h100")
    (launch,) = executor_for(fd).last_plan.spec.kernels
    body = launch.source[launch.source.index("__global__"):]
    first_reduce = body.index("fc_row_reduce")
    mask_store = re.search(r"fc_store_mask\(o1 ", body)  # Note [Mask words]
    assert mask_store and mask_store.start() < first_reduce
    assert len(re.findall(r"fc_store_mask\(o1 ", body)) == 1
    rng_var = re.search(r"const float (v\d+) = fc_rng_uniform", body).group(1)
    assert f"{rng_var}_c[" not in body


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_random_kernels_compile(dtype):
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=from_torch(dtype))
        fd.add_output(fd.ops.add(x, fd.ops.randn_like(x)))
        fd.add_output(fd.ops.lt(fd.ops.rand_like(x), 0.5))
    refs = fd.precompile([meta(256, 1000, dtype=dtype)], target="h100")
    assert len(refs) == 1 and "fc_rng_normal" in refs[0].source


def test_a_broadcast_random_op_gets_its_own_segment():
    """Numbers follow their op's element order: read through a broadcast, the op is made by
    a kernel of its own shape first."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True)
        s = fd.define_scalar(dtype=DataType.Int)
        u = fd.ops.uniform(0.0, 1.0, [fd.ops.size(x, 0), 1], rng_seed=s, rng_offset=s)
        fd.add_output(fd.ops.add(x, fd.ops.broadcast_in_dim(u, shape=fd.ops.shape(x),
                                                            broadcast_dims=[0, 1])))  # fmt: skip
    refs = fd.precompile([meta(64, 32, dtype=torch.float32), 3], target="h100")
    assert [s.scheduler for s in executor_for(fd).last_plan.segments] == ["pointwise"] * 2
    assert len(refs) == 2
    x = torch.randn(64, 32)
    (out,) = fd.execute([x, 3])
    (u,) = seeded("uniform", [64, 1]).execute([3, 3])
    torch.testing.assert_close(out, x + u)


def test_segments_of_one_run_see_one_draw(cpu_as_gpu):  # noqa: F811
    """A random value read by two segments (a row sum, and a pointwise output over another
    loop) is drawn from the run's one seed and offset in both (Note [Random seeds]); the
    next run draws new numbers."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True)
        u = fd.ops.rand_like(x)
        fd.add_output(fd.ops.sum(u, [1]))
        fd.add_output(fd.ops.permute(fd.ops.mul(u, x), [1, 0]))
    x = torch.rand(40, 30) + 1.0
    total, scaled = fd.execute([x])
    assert len(executor_for(fd).last_plan.segments) == 2
    torch.testing.assert_close(total, (scaled.t() / x).sum(1))
    again, _ = fd.execute([x])
    assert (again != total).all()


def test_new_seeds_reuse_the_plan(cpu_as_gpu):  # noqa: F811
    """A training step passes a new seed and offset each time: ints read only as seeds
    are not part of the plan key, so the plan (and its kernels) serve every step."""
    with FusionDefinition() as fd:
        seed, offset = fd.define_scalar(dtype=DataType.Int), fd.define_scalar(dtype=DataType.Int)
        x = fd.define_tensor(shape=[-1], contiguity=True)
        u = fd.ops.uniform(0.0, 1.0, fd.ops.shape(x), rng_seed=seed, rng_offset=offset)
        fd.add_output(fd.ops.add(x, u))
    x = torch.zeros(100)
    outs = [fd.execute([s, 4 * s, x])[0] for s in range(3)]
    assert len(executor_for(fd).plans) == 1
    assert not torch.equal(outs[0], outs[1])
    (want,) = seeded("uniform", [100]).execute([2, 8])
    assert torch.equal(outs[2], want)
