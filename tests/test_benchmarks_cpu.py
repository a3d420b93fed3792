"""The benchmark harness on the CPU: the case registry, the definitions and the report.

No GPU and no working library needed. The definitions are checked by running them through
`EagerFd`, a stand-in for FusionDefinition that evaluates each op with torch as it is
recorded; the real FusionDefinition only has to accept them (skipped while it is missing).
"""

from __future__ import annotations

import enum
import importlib.util
import json
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from benchmarks import cases as bench_cases
from benchmarks import report
from benchmarks.cases import CASES, FAMILIES, Case

SMALL = {1: (48,), 2: (6, 40), 3: (2, 6, 128), 4: (3, 5, 4, 2)}  # a small shape per rank, non-square


def small_shape(case: Case) -> tuple[int, ...]:
    return SMALL[len(case.shape)]


def test_registry_is_well_formed():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))
    for c in CASES:
        assert c.family in FAMILIES, c.name
        assert c.dtype in (torch.float32, torch.bfloat16), c.name
        assert c.bytes_moved > 0 and c.atol > 0 and c.rtol > 0, c.name
    assert {c.family for c in CASES} == set(FAMILIES)
    assert len(bench_cases.select(["pointwise"])) == 31  # 5 ops x 2 dtypes x 3 sizes + gelu


def test_bytes_count_reads_and_writes_once():
    (case,) = [c for c in CASES if c.name == "add_row_f32_4096x4096"]
    assert case.bytes_moved == (2 * 4096 * 4096 + 4096) * 4


def test_pattern_parts_select_cases_of_either():
    names = [c.name for c in bench_cases.select(["resize"], pattern="rope,embedding")]
    assert len(names) == 5 and all("rope" in n or "embedding" in n for n in names), names


def test_embedding_counts_the_rows_it_moves_not_the_table():
    """A gather reads the rows its tokens pick: the index, 8192 rows of 768 bf16 and the
    output; its gradient reads the index and the output's gradient and writes the table's."""
    by_name = {c.name: c for c in CASES}
    tokens, dim, vocab = 8 * 1024, 768, 50304
    fwd = by_name["embedding_fwd_bf16_50304x768x8x1024"]
    assert fwd.bytes_moved == tokens * 8 + 2 * tokens * dim * 2
    bwd = by_name["embedding_bwd_bf16_50304x768x8x1024"]
    assert bwd.bytes_moved == tokens * 8 + tokens * dim * 2 + vocab * dim * 2


def test_quick_keeps_one_shape_per_op_and_dtype():
    quick = bench_cases.select(["pointwise", "normalization"], quick=True)
    keys = [(c.op, c.dtype) for c in quick]
    assert len(keys) == len(set(keys))
    assert all(c.shape == (1024, 1024) for c in quick if c.family == "pointwise")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_eager_runs_on_small_cpu_tensors(case: Case):
    torch.manual_seed(0)
    inputs = case.inputs("cpu", small_shape(case))
    assert all(t.abs().sum() > 0 for t in inputs if t.is_floating_point())  # never zeros
    outputs = bench_cases.as_list(case.eager(*inputs))
    assert outputs and all(torch.isfinite(o.float()).all() for o in outputs)


# --- The definitions, through a torch-backed stand-in for FusionDefinition --------------------


class FakeDataType(enum.Enum):
    Float = torch.float32
    BFloat16 = torch.bfloat16
    Half = torch.float16
    Double = torch.float64


class EagerOps:
    """The fd.ops the suite uses, evaluated at once with torch."""

    add, sub, mul, div = torch.add, torch.sub, torch.mul, torch.div
    relu, tanh, exp, rsqrt = torch.relu, torch.tanh, torch.exp, torch.rsqrt

    @staticmethod
    def cast(t: torch.Tensor, dtype: FakeDataType) -> torch.Tensor:
        return t.to(dtype.value)

    @staticmethod
    def broadcast_in_dim(t: torch.Tensor, shape: list[int], dims: list[int]) -> torch.Tensor:
        assert t.dim() == len(dims)
        view = [t.shape[dims.index(i)] if i in dims else 1 for i in range(len(shape))]
        return t.reshape(view).expand(shape)

    @staticmethod
    def permute(t: torch.Tensor, dims: list[int]) -> torch.Tensor:
        return t.permute(dims)

    @staticmethod
    def set(t: torch.Tensor) -> torch.Tensor:
        # fd.ops.set copies: the result is a fresh tensor in the order its dims are in
        return t.contiguous().clone()

    @staticmethod
    def sum(t: torch.Tensor, dims: list[int], keepdim: bool = False) -> torch.Tensor:
        return t.sum(dims, keepdim=keepdim)

    @staticmethod
    def max(t: torch.Tensor, dims: list[int], keepdim: bool = False) -> torch.Tensor:
        return t.amax(dims, keepdim=keepdim)

    @staticmethod
    def var_mean(t: torch.Tensor, dims: list[int], correction: int = 1) -> tuple:
        return torch.var_mean(t, dims, correction=correction)

    @staticmethod
    def batch_norm(x, w, b, running_mean, running_var, momentum, eps, training) -> tuple:
        assert running_mean is None and running_var is None and training
        var, mean = torch.var_mean(x, [0, 2, 3], correction=0)
        return F.batch_norm(x, None, None, w, b, True, momentum, eps), mean, torch.rsqrt(var + eps)


class EagerFd:
    """Binds the i-th define_tensor to the i-th input and checks its rank and dtype."""

    ops = EagerOps

    def __init__(self, inputs: list[torch.Tensor]):
        self.pending = list(inputs)
        self.outputs: list[torch.Tensor] = []

    def define_tensor(self, shape: list[int], contiguity: list[bool], dtype: Any) -> torch.Tensor:
        t = self.pending.pop(0)
        assert len(shape) == len(contiguity) == t.dim() and dtype.value == t.dtype
        return t

    def define_scalar(self, value: float, dtype: Any) -> float:
        return value

    def add_output(self, t: torch.Tensor) -> None:
        self.outputs.append(t)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_definition_matches_eager(case: Case, monkeypatch):
    if case.family == "aten":
        pytest.skip("GEMM, attention and random ops: run through the library on the CPU in "
                    "tests/test_aten_benchmarks.py")
    import fusion_cache

    torch.manual_seed(0)
    shape = small_shape(case)
    inputs = case.inputs("cpu", shape)
    if case.family == "resize":  # more ops than EagerOps has: the library's own evaluator
        max_err, problem = case.compare(case.build(shape).execute(inputs), case.reference(inputs))
        assert problem is None, problem
        return
    monkeypatch.setattr(fusion_cache, "DataType", FakeDataType, raising=False)
    fd = EagerFd(inputs)
    case.define(fd, case.dtype, shape)
    assert not fd.pending, "inputs left unbound"
    max_err, problem = case.compare(fd.outputs, case.reference(inputs))
    assert problem is None, problem
    assert max_err is not None


def test_definitions_build_with_the_library():
    fusion_cache = pytest.importorskip("fusion_cache")
    if not hasattr(fusion_cache, "FusionDefinition"):
        pytest.skip("fusion_cache.FusionDefinition is not there yet")
    for case in CASES:
        case.build()


# --- The report --------------------------------------------------------------------------------


def _record(name: str, family: str, fusion_ms: float, compile_ms: float, **extra) -> dict:
    nbytes = 3 * 2**28
    record = {
        "name": name, "op": name.rsplit("_", 2)[0], "family": family, "dtype": "bf16",
        "shape": [16384, 4096], "bytes": nbytes, "large": True, "correct": True,
        "max_err": 0.0, "error": None, "first_call_s": 0.04,
        "fusion_ms": fusion_ms, "eager_ms": 2 * fusion_ms, "compile_ms": compile_ms,
        "speedup_vs_eager": 2.0, "speedup_vs_compile": compile_ms / fusion_ms,
    }
    for label, ms in (("fusion", fusion_ms), ("eager", 2 * fusion_ms), ("compile", compile_ms)):
        record[f"{label}_gbps"] = None if family == "host" else nbytes / (ms * 1e-3) / 1e9
    record["pct_of_ceiling"] = None if family == "host" else record["fusion_gbps"] / 30
    return {**record, **extra}


def test_report_writes_markdown_and_plot(tmp_path, capsys):
    run = {"date": "2026-01-01T00:00:00+00:00", "device": "NVIDIA H100 80GB HBM3",
           "torch": "2.11", "triton": "3.6", "cuda": "13.0", "copy_ceiling_gbps": 3000.0}
    data = {**run, "families": {
        "pointwise": {**run, "quick": False, "cache_stats": None, "cases": [
            _record("relu_mul_add_bf16_16384x4096", "pointwise", 0.28, 0.30),
            _record("gelu_bias_bf16_16384x4096", "pointwise", 0.40, 0.30,
                    correct=False, error="check: output 0: Tensor-likes are not close!"),
        ]},
        "host": {**run, "quick": False, "cache_stats": None, "cases": [
            _record("host_relu_mul_add_f32_8x8", "host", 0.012, 0.096, bytes=768, large=False),
        ]},
    }}
    path = tmp_path / "nvidia-h100-80gb-hbm3.json"
    path.write_text(json.dumps(data))

    assert report.main([str(path)]) == 0

    md = path.with_suffix(".md").read_text()
    assert "relu_mul_add_bf16_16384x4096" in md and "host_relu_mul_add_f32_8x8" in md
    assert "| large cases at >= 90% of the copy ceiling | 1 of 2 | **no** |" in md
    assert "0.750x (gelu_bias_bf16_16384x4096)" in md  # the slowest vs torch.compile
    assert "12.0 us vs eager 24.0 us" in md
    assert "at the copy ceiling" not in md.split("## pointwise")[0]  # no softmax case ran
    assert "Tensor-likes are not close" in md
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    assert path.with_suffix(".png").exists() == has_matplotlib
    if not has_matplotlib:
        assert "matplotlib is not installed" in capsys.readouterr().err


def test_results_merge_by_family(tmp_path):
    from benchmarks import run

    path = tmp_path / f"{run.device_slug('NVIDIA H100 80GB HBM3')}.json"
    assert path.name == "nvidia-h100-80gb-hbm3.json"
    first = {"date": "d1", "copy_ceiling_gbps": 3000.0}
    run.write_json(path, run.merge_results(path, first, {"pointwise": {"cases": [1]}}))
    second = {"date": "d2", "copy_ceiling_gbps": 2990.0}
    merged = run.merge_results(path, second, {"reduction": {"cases": [2]}})
    assert merged["date"] == "d2"
    assert merged["families"] == {"pointwise": {"cases": [1]}, "reduction": {"cases": [2]}}


def test_a_run_of_some_cases_replaces_only_those(tmp_path):
    # -k: the family keeps its other cases, and its note names each later run
    from benchmarks import run

    path = tmp_path / "gpu.json"
    cases = [{"name": "sum_a", "gbps": 1}, {"name": "sum_b", "gbps": 2}]
    run.write_json(path, run.merge_results(path, {"date": "d1"}, {"reduction": {"date": "d1", "cases": cases}}))
    for date, pattern, ran in (("d2", "sum_b", [{"name": "sum_b", "gbps": 3}, {"name": "sum_bb", "gbps": 4}]),
                               ("d3", "sum_a", [{"name": "sum_a", "gbps": 5}])):  # fmt: skip
        later = {"date": date, "copy_ceiling_gbps": 2990.0}
        run.write_json(path, run.merge_results(path, later, {"reduction": {"date": date, "cases": ran}}, pattern))
    family = json.loads(path.read_text())["families"]["reduction"]
    assert [(c["name"], c["gbps"]) for c in family["cases"]] == [("sum_a", 5), ("sum_b", 3), ("sum_bb", 4)]
    assert family["date"] == "d1"
    assert "'sum_b' (2) re-measured in the run of d2" in family["note"]
    assert "'sum_a' (1) re-measured in the run of d3" in family["note"]


def test_rates_from_times():
    from benchmarks import run

    record = {"family": "pointwise", "bytes": 3 * 10**9,
              "fusion_ms": 1000.0, "eager_ms": 2000.0, "compile_ms": 1500.0}
    run.add_rates(record, ceiling=4.0)
    assert record["fusion_gbps"] == pytest.approx(3.0)
    assert record["pct_of_ceiling"] == pytest.approx(75.0)
    assert record["speedup_vs_eager"] == pytest.approx(2.0)
    assert record["speedup_vs_compile"] == pytest.approx(1.5)


def test_size_matched_copy_is_reported_beside_the_ceiling(tmp_path):
    """Case.size_matched: a copy of the case's own bytes timed in the same rounds gives
    pct_of_size_copy; pct_of_ceiling (the judged figure) is unchanged, and the report adds a
    column only to a family with such cases."""
    from benchmarks import report, run
    from benchmarks.cases import CASES

    sized = {c.name for c in CASES if c.size_matched}
    assert sized == {"embedding_fwd_bf16_50304x768x8x1024", "embedding_bwd_bf16_50304x768x8x1024",
                     "embedding_bwd_padded_bf16_50304x768x8x1024"}  # fmt: skip
    record = {"family": "resize", "bytes": 3 * 10**9, "fusion_ms": 1000.0, "eager_ms": 2000.0,
              "compile_ms": 1500.0, "size_copy_ms": 800.0}  # fmt: skip
    run.add_rates(record, ceiling=4.0)
    assert record["pct_of_ceiling"] == pytest.approx(75.0)
    assert record["size_copy_gbps"] == pytest.approx(3.75)
    assert record["pct_of_size_copy"] == pytest.approx(80.0)
    table = "\n".join(report.family_table("resize", {"cases": [
        {**_record("embedding_fwd_bf16_50304x768x8x1024", "resize", 0.28, 0.30), **record},
        _record("pad_bf16_8192x4096", "resize", 0.28, 0.30)]}))  # fmt: skip
    assert "% copy of its size |" in table and "| 80% of 4 |" in table and "| - |" in table
    plain = "\n".join(report.family_table("pointwise", {"cases": [
        _record("relu_mul_add_bf16_16384x4096", "pointwise", 0.28, 0.30)]}))  # fmt: skip
    assert "copy of its size" not in plain


def test_timing_rounds_interleave_and_drop_a_failing_run():
    from benchmarks import run

    order: list[str] = []
    clock = iter([3.0, 9.0, 1.0, 8.0, 2.0, 7.0])  # fusion, eager, then again, three rounds

    def measure(fn):
        order.append(fn())
        return next(clock)

    def stage(label, fn):
        try:
            return fn()
        except RuntimeError:
            return None

    def broken():
        raise RuntimeError("torch.compile fell over")

    runs = {"fusion": lambda: "f", "eager": lambda: "e", "compile": broken, "none": None}
    times = run.timed_rounds(runs, measure, stage, rounds=3)
    assert order == ["f", "e", "f", "e", "f", "e"]  # in turn, each round; compile timed once
    assert times == {"fusion": [3.0, 1.0, 2.0], "eager": [9.0, 8.0, 7.0], "compile": [], "none": []}


def test_ncu_stalls_reads_reasons_and_the_stalled_instructions():
    from benchmarks.ncu_stalls import stall_reasons, top_instructions

    metric = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
    raw = (f'"Kernel Name","{metric.format("barrier")}","{metric.format("membar")}","dram__x"\n'
           '"","ratio","ratio","byte"\n"fc_inner_reduction","2.80","4.40","1,024"\n')
    assert stall_reasons(raw) == [("membar", 4.4), ("barrier", 2.8)]
    assert stall_reasons("") == []

    source = ('"Kernel Name","fc_inner_reduction",\n'
              '"Address","Source","Warp Stall Sampling (All Samples)","stall_barrier",'
              '"stall_membar","stall_barrier (Not Issued)"\n'
              '"0x10","  ERRBAR","30","1","29","0"\n'
              '"0x20","  UCGABAR_WAIT","60","58","2","0"\n'
              '"0x30","  FADD R1, R2, R3","10","0","0","0"\n')
    top = top_instructions(source, 2)
    assert [(round(s, 2), t, r) for s, t, r in top] == [(0.6, "UCGABAR_WAIT", "barrier"),
                                                        (0.3, "ERRBAR", "membar")]
    assert top_instructions('"no","table"\n') == []


def test_named_on_gpu_says_why_it_has_no_cases(monkeypatch, capsys):
    from benchmarks.cases import named_on_gpu

    name = CASES[0].name
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert named_on_gpu("benchmarks.probe", [name]) is None
    assert "benchmarks.probe needs a CUDA GPU" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert named_on_gpu("benchmarks.probe", [name, "no_such_case"]) is None
    assert "unknown case(s) ['no_such_case']" in capsys.readouterr().err
    assert named_on_gpu("benchmarks.probe", [name]) == [CASES[0]]


def test_softmax_target_shows_its_bound_at_the_copy_ceiling():
    # torch.compile at 2900 GB/s in one case and 1000 in another: a fusion at the 3000 GB/s
    # ceiling in both would lead by the geometric mean of 3000/2900 and 3000/1000
    nbytes = 3 * 2**28
    cases = [_record("softmax_f32_16384x4096", "normalization", 0.3, nbytes / 2.9e12 * 1e3),
             _record("softmax_f32_256x262144", "normalization", 0.3, nbytes / 1.0e12 * 1e3)]
    s = report.summarize({"families": {"normalization": {"cases": cases}}})
    assert abs(s["softmax_at_ceiling"] - math.sqrt(3000 / 2900 * 3000 / 1000)) < 1e-9
    assert "1.762x with every case at the copy ceiling" in "\n".join(report.targets_table(s))


def test_step_kernels_groups_kernels_by_family_and_sums_a_step():
    from benchmarks.step_kernels import group_of, render

    assert group_of("sm90_xmma_gemm_bf16bf16_bf16f32") == "gemm"
    assert group_of("pytorch_flash::flash_fwd_kernel") == "attention"
    assert group_of("fc_pointwise_3f2a") == "ours"
    assert group_of("triton_per_fused_add_0") == "triton"
    assert group_of("void at::native::vectorized_elementwise_kernel") == "aten-other"
    per_kernel = {"fc_a": [300.0, 2], "triton_b": [100.0, 2]}
    text = render("gpt2", "fusion_cache", per_kernel, [0.004, 0.005, 0.006], steps=2, top=5)
    assert "step wall 5.00 ms, kernel time 0.200 ms, kernels 2 per step" in text
    assert "ours 0.150 ms (1)" in text and "triton 0.050 ms (1)" in text


def test_step_kernels_timeline_finds_gaps_waits_and_host_ops_of_a_marked_step():
    from benchmarks.step_kernels import render_timeline, summarize_trace

    def ev(cat, name, ts, dur, corr=None, tid=1):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid,
                "args": {} if corr is None else {"correlation": corr}}  # fmt: skip

    trace = {"traceEvents": [
        ev("cuda_runtime", "cudaLaunchKernel", 0, 3, 1), ev("kernel", "spin_kernel", 5, 1, 1, 7),
        ev("cpu_op", "CompiledFunction", 1, 40), ev("cpu_op", "aten::mm", 2, 10),
        ev("cuda_runtime", "cudaLaunchKernel", 5, 3, 2), ev("kernel", "sm90_gemm", 8, 4, 2, 7),
        ev("cuda_driver", "cuLaunchKernelEx", 30, 3, 3), ev("kernel", "fc_x", 33, 2, 3, 7),
        ev("cuda_runtime", "cudaStreamSynchronize", 35, 5),
        ev("cuda_runtime", "cudaLaunchKernel", 45, 1, 4), ev("kernel", "spin_kernel", 46, 1, 4, 7),
        ev("cuda_runtime", "cudaDeviceSynchronize", 48, 2)]}  # fmt: skip
    (step,) = summarize_trace(trace)
    assert (step["wall_us"], step["issue_us"], step["kernels"]) == (50, 45, 2)
    assert (step["gpu_busy_us"], step["gpu_idle_us"]) == (6, 21)
    assert step["top_gaps"] == [[21, 18, "fc_x", "CompiledFunction"]]
    assert step["gap_by_host_op"] == {"CompiledFunction": [1, 21]}
    assert step["suspects"] == [["cudaStreamSynchronize", 35, 5, "CompiledFunction"]]
    assert step["outer_ops"] == {"CompiledFunction": [1, 40, 2]}
    assert step["self_ops"]["CompiledFunction"] == [1, 22] and step["self_ops"]["aten::mm"] == [1, 7]
    run = {"walls_ms": [0.05], "gc": {}, "device_allocs": {}, "steps": [step]}
    text = render_timeline("llama", {"fusion_cache": {"unprofiled_ms": [0.05], "light": run,
                                                      "ops": run}})  # fmt: skip
    assert "cudaStreamSynchronize @35.0 5.0us [CompiledFunction]" in text, text
