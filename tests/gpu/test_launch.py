"""Prelude kernels compiled with NVRTC, loaded and launched on the GPU, checked against torch."""

import functools
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from codegen.launch import LaunchError, ModuleLoadError, gpu_available, load_kernel  # noqa: E402
from codegen.nvrtc import compile_cubin  # noqa: E402
from codegen.prelude import prelude_source  # noqa: E402
from schedulers.device import current_profile, profile_by_name  # noqa: E402

pytestmark = pytest.mark.gpu

CUDA = "cuda"


def _arch() -> int:
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


@functools.cache
def _cubin(body: str, features: tuple[str, ...] = ("reduce",)) -> bytes:
    return compile_cubin(prelude_source(*features) + body, _arch())


def _kernel(name: str, body: str):
    return load_kernel(_cubin(body), name)


def _grid(n: int, block: int) -> tuple[int, int, int]:
    return ((n + block - 1) // block, 1, 1)


# ---- elementwise -----------------------------------------------------------------------------

GELU = r"""
extern "C" __global__ void gelu_tanh(const float* x, float* y, int64_t n) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = fc_gelu_tanh(x[i]);
}
"""


def test_gpu_available():
    assert gpu_available()


def test_gelu_tanh_matches_torch():
    n = 100_003
    x = torch.randn(n, device=CUDA) * 3
    y = torch.empty_like(x)
    _kernel("gelu_tanh", GELU).launch(_grid(n, 256), (256, 1, 1), ("ptr", "ptr", "i64"),
                                      (x.data_ptr(), y.data_ptr(), n))
    torch.testing.assert_close(y, torch.nn.functional.gelu(x, approximate="tanh"))


CONVERT = r"""
extern "C" __global__ void convert(const float* x, const double* xd, fc_half* h, fc_bf16* b,
                                   fc_half* hd, fc_bf16* bd, float* hf, float* bf, int64_t n) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  const fc_half hh = fc_to_half(x[i]);
  const fc_bf16 bb = fc_cast<fc_bf16>(x[i]);
  h[i] = hh;
  b[i] = bb;
  hd[i] = fc_cast<fc_half>(xd[i]);
  bd[i] = fc_to_bf16(xd[i]);
  hf[i] = fc_to_float(hh);
  bf[i] = fc_cast<float>(bb);
}
"""


def _special_floats() -> list[float]:
    return [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 65504.0, 65519.0, 65520.0,
            1e-8, -3e-5, 6e-8, 3e38, -3.3e38, 1.0 + 2**-11, 1.0 + 3 * 2**-11, 2.5, -0.5]


def _assert_same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))


def test_half_and_bf16_round_trips_match_torch_bitwise():
    special = torch.tensor(_special_floats(), device=CUDA)
    x = torch.cat([torch.randn(50_000, device=CUDA) * 1000, torch.randn(50_000, device=CUDA),
                   torch.randn(1000, device=CUDA) * 1e-6, special])
    # Doubles just off float-exact half ties: torch rounds double -> float -> half, as we do.
    xd = torch.cat([x.double(), torch.tensor([1.0 + 2**-11 + 2**-40, 1.0 + 2**-8 + 2**-35],
                                             dtype=torch.float64, device=CUDA)])
    x = torch.cat([x, xd[-2:].float()])
    n = x.numel()
    h = torch.empty(n, dtype=torch.float16, device=CUDA)
    b = torch.empty(n, dtype=torch.bfloat16, device=CUDA)
    hd, bd = torch.empty_like(h), torch.empty_like(b)
    hf, bf = torch.empty_like(x), torch.empty_like(x)
    _kernel("convert", CONVERT).launch(
        _grid(n, 128), (128, 1, 1), ("ptr",) * 8 + ("i64",),
        (x.data_ptr(), xd.data_ptr(), h.data_ptr(), b.data_ptr(), hd.data_ptr(), bd.data_ptr(),
         hf.data_ptr(), bf.data_ptr(), n),
    )
    _assert_same_bits(h, x.half())
    _assert_same_bits(b, x.bfloat16())
    _assert_same_bits(hd, xd.half())
    _assert_same_bits(bd, xd.bfloat16())
    torch.testing.assert_close(hf, x.half().float(), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(bf, x.bfloat16().float(), rtol=0, atol=0, equal_nan=True)


# Each entry: (name, CUDA expression in x and y, torch reference on tensors a and b).
FLOAT_OPS = [
    ("gelu_tanh", "fc_gelu_tanh(x)", lambda a, b: torch.nn.functional.gelu(a, approximate="tanh")),
    ("gelu", "fc_gelu(x)", lambda a, b: torch.nn.functional.gelu(a)),
    ("sigmoid", "fc_sigmoid(x)", lambda a, b: torch.sigmoid(a)),
    ("silu", "fc_silu(x)", lambda a, b: torch.nn.functional.silu(a)),
    ("erfinv", "fc_erfinv(x * T(0.3))", lambda a, b: torch.erfinv(a * 0.3)),
    ("lgamma", "fc_lgamma(x)", lambda a, b: torch.lgamma(a)),
    ("remainder", "fc_remainder(x, y)", torch.remainder),
    ("fmod", "fc_fmod(x, y)", torch.fmod),
    ("div_trunc", "fc_div_trunc(x, y)", lambda a, b: torch.div(a, b, rounding_mode="trunc")),
    ("div_floor", "fc_div_floor(x, y)", lambda a, b: torch.div(a, b, rounding_mode="floor")),
    ("pow", "fc_pow(x, y)", torch.pow),
    ("sign", "fc_sign(x)", lambda a, b: torch.sign(a)),
    ("abs", "fc_abs(x)", lambda a, b: torch.abs(a)),
    ("signbit", "(T)fc_signbit(x)", lambda a, b: torch.signbit(a).to(a.dtype)),
    ("round", "fc_round_half_even(x)", lambda a, b: torch.round(a)),
    ("frac", "fc_frac(x)", lambda a, b: torch.frac(a)),
    ("relu", "fc_relu(x)", lambda a, b: torch.relu(a)),
    ("maximum", "fc_maximum(x, y)", torch.maximum),
    ("minimum", "fc_minimum(x, y)", torch.minimum),
    ("clamp", "fc_clamp(x, T(-0.5), T(0.7))", lambda a, b: torch.clamp(a, -0.5, 0.7)),
    ("clamp_t", "fc_clamp(x, y, y + T(1))", lambda a, b: torch.clamp(a, b, b + 1)),
    ("nextafter", "fc_nextafter(x, y)", torch.nextafter),
    ("isnan", "(T)fc_isnan(x)", lambda a, b: torch.isnan(a).to(a.dtype)),
    ("isinf", "(T)fc_isinf(x)", lambda a, b: torch.isinf(a).to(a.dtype)),
    ("isfinite", "(T)fc_isfinite(x)", lambda a, b: torch.isfinite(a).to(a.dtype)),
    ("isposinf", "(T)fc_isposinf(x)", lambda a, b: torch.isposinf(a).to(a.dtype)),
    ("isneginf", "(T)fc_isneginf(x)", lambda a, b: torch.isneginf(a).to(a.dtype)),
]

INT_OPS = [
    ("remainder", "fc_remainder(x, y)", torch.remainder),
    ("fmod", "fc_fmod(x, y)", torch.fmod),
    ("div_trunc", "fc_div_trunc(x, y)", lambda a, b: torch.div(a, b, rounding_mode="trunc")),
    ("div_floor", "fc_div_floor(x, y)", lambda a, b: torch.div(a, b, rounding_mode="floor")),
    ("gcd", "fc_gcd(x, y)", torch.gcd),
    ("pow", "fc_pow(x, y)", lambda a, b: torch.pow(a, b % 7 - 2)),
    ("shl", "fc_shl(x, y)", lambda a, b: a << b),
    ("shr", "fc_shr(x, y)", lambda a, b: a >> b),
    ("sign", "fc_sign(x)", lambda a, b: torch.sign(a)),
    ("abs", "fc_abs(x)", lambda a, b: torch.abs(a)),
    ("maximum", "fc_maximum(x, y)", torch.maximum),
    ("minimum", "fc_minimum(x, y)", torch.minimum),
    ("clamp", "fc_clamp(x, T(-3), T(4))", lambda a, b: torch.clamp(a, -3, 4)),
    ("relu", "fc_relu(x)", lambda a, b: torch.relu(a)),
    ("isfinite", "(T)fc_isfinite(x)", lambda a, b: torch.isfinite(a).to(a.dtype)),
]

C_TYPES = {torch.float32: "float", torch.float64: "double", torch.int32: "int32_t",
           torch.int64: "int64_t", torch.uint8: "uint8_t", torch.int8: "int8_t"}


def _battery_source(ops, dtype) -> str:
    ctype = C_TYPES[dtype]
    cases = "\n".join(
        f"    case {i}: r = {expr}; break;" for i, (_, expr, _) in enumerate(ops)
    )
    # The int pow case maps exponents into [-2, 4] like its torch reference.
    return f"""
typedef {ctype} T;
extern "C" __global__ void battery_{ctype}(const T* a, const T* b, T* out, int op, int64_t n) {{
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  T x = a[i], y = b[i], r = T(0);
  if (op == {_pow_index(ops)}) y = fc_remainder(y, T(7)) - T(2);
  switch (op) {{
{cases}
  }}
  out[i] = r;
}}
"""


def _pow_index(ops) -> int:
    names = [name for name, _, _ in ops]
    return names.index("pow") if ops is INT_OPS else -1


def _float_inputs(dtype) -> tuple[torch.Tensor, torch.Tensor]:
    n = 20_000
    special = torch.tensor(_special_floats() + [1.5, -1.5, 0.5, 3.5, -2.5, 7.0, -7.0],
                           dtype=dtype, device=CUDA)
    a = torch.cat([torch.randn(n, dtype=dtype, device=CUDA) * 3, special, special])
    b = torch.cat([torch.randn(n, dtype=dtype, device=CUDA) * 2, special, special.flip(0)])
    return a, b


def _int_inputs(dtype) -> tuple[torch.Tensor, torch.Tensor]:
    n = 20_000
    info = torch.iinfo(dtype)
    a = torch.randint(max(info.min, -1000), min(info.max, 1000), (n,), dtype=dtype, device=CUDA)
    b = torch.randint(max(info.min, -9), 10, (n,), dtype=dtype, device=CUDA)
    b[b == 0] = 3
    return a, b


# Transcendentals: libdevice results within a few ulp of torch's (which uses the same).
LOOSE = {"lgamma", "erfinv", "pow", "gelu", "gelu_tanh", "sigmoid", "silu"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("op", [name for name, _, _ in FLOAT_OPS])
def test_float_math_matches_torch(op, dtype):
    index = [name for name, _, _ in FLOAT_OPS].index(op)
    a, b = _float_inputs(dtype)
    out = torch.empty_like(a)
    kernel = _kernel(f"battery_{C_TYPES[dtype]}", _battery_source(FLOAT_OPS, dtype))
    kernel.launch(_grid(a.numel(), 256), (256, 1, 1), ("ptr", "ptr", "ptr", "i32", "i64"),
                  (a.data_ptr(), b.data_ptr(), out.data_ptr(), index, a.numel()))
    want = FLOAT_OPS[index][2](a, b)
    tol = {"rtol": 2e-6, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    if op in LOOSE:
        tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-10,
                                                                            "atol": 1e-10}
    torch.testing.assert_close(out, want, equal_nan=True, **tol)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int8, torch.uint8])
@pytest.mark.parametrize("op", [name for name, _, _ in INT_OPS])
def test_int_math_matches_torch(op, dtype):
    if dtype == torch.uint8 and op == "clamp":
        pytest.skip("the bounds -3 and 4 are not uint8 values")
    index = [name for name, _, _ in INT_OPS].index(op)
    a, b = _int_inputs(dtype)
    if op in {"shl", "shr"}:
        b = torch.randint(-2, 8 * a.element_size() + 3, b.shape, device=CUDA).to(dtype)
        if dtype == torch.uint8:
            b = b.clamp(min=0)
    out = torch.empty_like(a)
    kernel = _kernel(f"battery_{C_TYPES[dtype]}", _battery_source(INT_OPS, dtype))
    kernel.launch(_grid(a.numel(), 256), (256, 1, 1), ("ptr", "ptr", "ptr", "i32", "i64"),
                  (a.data_ptr(), b.data_ptr(), out.data_ptr(), index, a.numel()))
    want = INT_OPS[index][2](a, b)
    torch.testing.assert_close(out, want, rtol=0, atol=0)


# ---- vector loads ----------------------------------------------------------------------------

VEC = r"""
extern "C" __global__ void copy_f32x4(const float* x, float* y, int64_t n_vec) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n_vec) fc_store_vec<4>(y + 4 * i, fc_load_vec_ro<4>(x + 4 * i));
}
extern "C" __global__ void scale_f16x8(const fc_half* x, fc_half* y, int64_t n_vec) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= n_vec) return;
  fc_vec<fc_half, 8> v = fc_load_vec<8>(x + 8 * i);
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = fc_to_half(fc_to_float(v[k]) * 2.0f);
  fc_store_vec<8>(y + 8 * i, v);
}
"""


def test_vector_loads_and_stores():
    n = 4 * 8 * 1000
    x = torch.randn(n, device=CUDA)
    y = torch.empty_like(x)
    _kernel("copy_f32x4", VEC).launch(_grid(n // 4, 128), (128, 1, 1), ("ptr", "ptr", "i64"),
                                      (x.data_ptr(), y.data_ptr(), n // 4))
    assert torch.equal(x, y)
    h = x.half()
    out = torch.empty_like(h)
    _kernel("scale_f16x8", VEC).launch(_grid(n // 8, 128), (128, 1, 1), ("ptr", "ptr", "i64"),
                                       (h.data_ptr(), out.data_ptr(), n // 8))
    assert torch.equal(out, h * 2)


# ---- reductions ------------------------------------------------------------------------------

ROW_REDUCE = r"""
template <typename T, typename Op>
__device__ void row_reduce(const T* x, T* out, int64_t cols, Op op) {
  __shared__ T smem[32];
  const int64_t row = blockIdx.x;
  const unsigned tid = fc_linear_tid(), nthreads = fc_block_threads();
  T acc = op.identity();
  for (int64_t j = tid; j < cols; j += nthreads) acc = op(acc, x[row * cols + j]);
  acc = fc_block_reduce(acc, op, smem);
  if (tid == nthreads - 1) out[row] = acc;  // every thread holds the result
}
#define ROW_KERNEL(NAME, T, OP) \
  extern "C" __global__ void NAME(const T* x, T* out, int64_t cols) { \
    row_reduce(x, out, cols, OP<T>()); }
ROW_KERNEL(sum_float, float, fc_op_sum)
ROW_KERNEL(max_float, float, fc_op_max)
ROW_KERNEL(min_float, float, fc_op_min)
ROW_KERNEL(sum_double, double, fc_op_sum)
ROW_KERNEL(max_double, double, fc_op_max)
ROW_KERNEL(min_double, double, fc_op_min)
ROW_KERNEL(sum_int64_t, int64_t, fc_op_sum)
ROW_KERNEL(max_int64_t, int64_t, fc_op_max)
"""

TORCH_REDUCE = {"sum": lambda t: t.sum(1), "max": lambda t: t.amax(1), "min": lambda t: t.amin(1)}


@pytest.mark.parametrize("block", [(32, 1, 1), (96, 1, 1), (128, 1, 1), (1000, 1, 1),
                                   (1024, 1, 1), (20, 1, 1), (10, 5, 1), (8, 4, 2)])
@pytest.mark.parametrize("op, dtype", [("sum", torch.float32), ("max", torch.float32),
                                       ("min", torch.float32), ("sum", torch.float64),
                                       ("max", torch.float64), ("sum", torch.int64),
                                       ("max", torch.int64)])
def test_block_reduce_rows(op, dtype, block):
    rows, cols = 37, 3001
    if dtype.is_floating_point:
        x = torch.randn(rows, cols, dtype=dtype, device=CUDA) * 4
        x[3, 100] = float("nan")  # max / min must propagate it like torch.amax / amin
    else:
        x = torch.randint(-(2**40), 2**40, (rows, cols), dtype=dtype, device=CUDA)
    out = torch.empty(rows, dtype=dtype, device=CUDA)
    name = f"{op}_{C_TYPES[dtype]}"
    _kernel(name, ROW_REDUCE).launch((rows, 1, 1), block, ("ptr", "ptr", "i64"),
                                     (x.data_ptr(), out.data_ptr(), cols))
    again = torch.empty_like(out)
    _kernel(name, ROW_REDUCE).launch((rows, 1, 1), block, ("ptr", "ptr", "i64"),
                                     (x.data_ptr(), again.data_ptr(), cols))
    assert torch.equal(out.nan_to_num(), again.nan_to_num())  # same bits on every run
    want = TORCH_REDUCE[op](x)
    if dtype == torch.int64 or op != "sum":
        torch.testing.assert_close(out, want, rtol=0, atol=0, equal_nan=True)
    else:  # another summation order: error grows with the sum of |x|, not with the result
        scale = x.abs().nan_to_num(0.0).sum(1).max().item()
        atol = 1e-6 * scale if dtype == torch.float32 else 1e-14 * scale
        torch.testing.assert_close(out, want, rtol=1e-5, atol=atol, equal_nan=True)


REDUCE_XY = r"""
// One row per threadIdx.y, reduced over x.
extern "C" __global__ void rows_x(const float* x, float* out, int64_t rows, int64_t cols) {
  __shared__ float smem[32];
  const int64_t row = blockIdx.x * (int64_t)blockDim.y + threadIdx.y;
  float acc = 0.0f;
  if (row < rows)
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) acc += x[row * cols + j];
  acc = fc_block_reduce_x(acc, fc_op_sum<float>(), smem);
  if (row < rows && threadIdx.x == blockDim.x - 1) out[row] = acc;
}
"""


@pytest.mark.parametrize("bdx, bdy", [(8, 3), (16, 4), (32, 8), (64, 4), (256, 2), (1024, 1)])
def test_block_reduce_x(bdx, bdy):
    rows, cols = 101, 777
    x = torch.randn(rows, cols, device=CUDA)
    out = torch.empty(rows, device=CUDA)
    _kernel("rows_x", REDUCE_XY).launch(((rows + bdy - 1) // bdy, 1, 1), (bdx, bdy, 1),
                                        ("ptr", "ptr", "i64", "i64"),
                                        (x.data_ptr(), out.data_ptr(), rows, cols))
    torch.testing.assert_close(out, x.sum(1), rtol=1e-5, atol=1e-4)


FOLD_ROWS = r"""
// VEC columns a thread, TY thread rows a block, folded by fc_fold_rows (Note [Row fold]);
// the last thread row writes, as every row holds the results.
template <int TX, int TY, int VEC, int S>
__device__ void fold_cols(const float* x, float* out, int64_t rows, int64_t cols) {
  __shared__ float smem[TX * TY * S + (TX * TY > TX * S ? TX * TY : TX * S)];
  const int64_t c0 = ((int64_t)blockIdx.x * TX + threadIdx.x) * VEC;
  float acc[VEC];
  for (int j = 0; j < VEC; ++j) acc[j] = 0.0f;
  for (int64_t r = threadIdx.y; r < rows; r += TY)
    for (int j = 0; j < VEC; ++j) if (c0 + j < cols) acc[j] += x[r * cols + c0 + j];
  fc_fold_rows<TX, TY, VEC, S>(acc, fc_op_sum<float>(), smem);
  if (threadIdx.y == TY - 1)
    for (int j = 0; j < VEC; ++j) if (c0 + j < cols) out[c0 + j] = acc[j];
}
#define FOLD(TX, TY, VEC, S)                                                                  \
  extern "C" __global__ void fold_##TX##_##TY##_##VEC##_##S(const float* x, float* out,      \
                                                            int64_t rows, int64_t cols) {    \
    fold_cols<TX, TY, VEC, S>(x, out, rows, cols);                                           \
  }
FOLD(32, 8, 8, 8)
FOLD(8, 64, 8, 4)
FOLD(32, 4, 8, 8)
FOLD(16, 5, 1, 1)
FOLD(1, 64, 4, 4)
FOLD(128, 2, 4, 2)
"""


# one thread a column (G = 1), columns split over 16 threads, fewer threads than columns
# (each folds two), an odd row count, one column thread, two rounds of S
FOLDS = [(32, 8, 8, 8), (8, 64, 8, 4), (32, 4, 8, 8), (16, 5, 1, 1), (1, 64, 4, 4), (128, 2, 4, 2)]


@pytest.mark.parametrize("tx, ty, vec, s", FOLDS)
def test_fold_rows(tx, ty, vec, s):
    rows, cols = 999, 333
    x = torch.randn(rows, cols, device=CUDA)
    out = torch.empty(cols, device=CUDA)
    _kernel(f"fold_{tx}_{ty}_{vec}_{s}", FOLD_ROWS).launch(
        (-(-cols // (tx * vec)), 1, 1), (tx, ty, 1), ("ptr", "ptr", "i64", "i64"),
        (x.data_ptr(), out.data_ptr(), rows, cols))
    torch.testing.assert_close(out, x.sum(0), rtol=1e-5, atol=1e-4)


WELFORD = r"""
template <typename T, typename N>
__device__ void var_mean_rows(const T* x, T* mean, T* var, T* var0, int64_t cols) {
  __shared__ fc_welford<T, N> smem[32];
  const int64_t row = blockIdx.x;
  fc_welford<T, N> w = fc_welford_init<T, N>();
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) w = fc_welford_update(w, x[row * cols + j]);
  w = fc_block_reduce(w, fc_op_welford<T, N>(), smem);
  if (threadIdx.x == 0) {
    mean[row] = w.mean;
    var[row] = fc_welford_var(w, T(1));
    var0[row] = fc_welford_var(w, T(0));
  }
}
extern "C" __global__ void var_mean_float(const float* x, float* m, float* v, float* v0, int64_t c) {
  var_mean_rows<float, int>(x, m, v, v0, c);
}
extern "C" __global__ void var_mean_double(const double* x, double* m, double* v, double* v0,
                                           int64_t c) {
  var_mean_rows<double, int64_t>(x, m, v, v0, c);
}
// One row per warp: the warp-level Welford path.
extern "C" __global__ void var_mean_warp(const float* x, float* m, float* v, int64_t rows,
                                         int64_t cols) {
  const int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;  // whole warps leave together
  fc_welford<float> w = fc_welford_init<float>();
  for (int64_t j = threadIdx.x % 32; j < cols; j += 32) w = fc_welford_update(w, x[row * cols + j]);
  w = fc_shfl(fc_warp_reduce(w, fc_op_welford<float>()), 0);
  if (threadIdx.x % 32 == 0) { m[row] = w.mean; v[row] = fc_welford_var(w, 1.0f); }
}
"""


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("block", [64, 200, 512, 1024])
def test_welford_var_mean(dtype, block):
    rows, cols = 29, 5003
    x = torch.randn(rows, cols, dtype=dtype, device=CUDA) * 2 + 5  # offset mean: stability
    x[0, :1] = 1e3
    mean, var, var0 = (torch.empty(rows, dtype=dtype, device=CUDA) for _ in range(3))
    _kernel(f"var_mean_{C_TYPES[dtype]}", WELFORD).launch(
        (rows, 1, 1), (block, 1, 1), ("ptr",) * 4 + ("i64",),
        (x.data_ptr(), mean.data_ptr(), var.data_ptr(), var0.data_ptr(), cols),
    )
    want_var, want_mean = torch.var_mean(x, dim=1)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}
    torch.testing.assert_close(mean, want_mean, **tol)
    torch.testing.assert_close(var, want_var, **tol)
    torch.testing.assert_close(var0, torch.var(x, dim=1, correction=0), **tol)


def test_welford_warp_and_degenerate_rows():
    rows, cols = 40, 1000
    x = torch.randn(rows, cols, device=CUDA) * 3 - 1
    mean, var = torch.empty(rows, device=CUDA), torch.empty(rows, device=CUDA)
    _kernel("var_mean_warp", WELFORD).launch((rows // 4, 1, 1), (128, 1, 1),
                                             ("ptr", "ptr", "ptr", "i64", "i64"),
                                             (x.data_ptr(), mean.data_ptr(), var.data_ptr(),
                                              rows, cols))
    want_var, want_mean = torch.var_mean(x, dim=1)
    torch.testing.assert_close(mean, want_mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(var, want_var, rtol=1e-5, atol=1e-5)
    # A single element per row: var with correction 1 is NaN, as in torch.
    one = torch.randn(3, 1, device=CUDA)
    m, v, v0 = (torch.empty(3, device=CUDA) for _ in range(3))
    _kernel("var_mean_float", WELFORD).launch((3, 1, 1), (64, 1, 1), ("ptr",) * 4 + ("i64",),
                                              (one.data_ptr(), m.data_ptr(), v.data_ptr(),
                                               v0.data_ptr(), 1))
    torch.testing.assert_close(v, torch.var(one, dim=1), equal_nan=True)
    torch.testing.assert_close(m, one[:, 0])
    assert torch.equal(v0, torch.zeros(3, device=CUDA))


# ---- launch mechanics ------------------------------------------------------------------------

ARGS = r"""
extern "C" __global__ void echo_args(int64_t* oi, double* od, bool flag, double d, int32_t i32,
                                     float f, int64_t i64, bool flag2, float* of) {
  oi[0] = flag; oi[1] = i32; oi[2] = i64; oi[3] = flag2;
  od[0] = d;
  of[0] = f;
}
"""


def test_argument_packing_respects_alignment():
    oi = torch.zeros(4, dtype=torch.int64, device=CUDA)
    od = torch.zeros(1, dtype=torch.float64, device=CUDA)
    of = torch.zeros(1, dtype=torch.float32, device=CUDA)
    kernel = _kernel("echo_args", ARGS)
    types = ("ptr", "ptr", "bool", "f64", "i32", "f32", "i64", "bool", "ptr")
    kernel.launch((1, 1, 1), (1, 1, 1), types,
                  (oi.data_ptr(), od.data_ptr(), True, -1.25e300, -7, 3.5, -(2**62) - 3, False,
                   of.data_ptr()))
    assert oi.tolist() == [1, -7, -(2**62) - 3, 0]
    assert od.item() == -1.25e300
    assert of.item() == 3.5


def test_bad_arguments_raise_launch_error():
    kernel = _kernel("gelu_tanh", GELU)
    with pytest.raises(LaunchError):
        kernel.launch((1, 1, 1), (32, 1, 1), ("ptr", "ptr", "i64"), (0, 0))  # one missing
    with pytest.raises(LaunchError):
        kernel.launch((1, 1, 1), (32, 1, 1), ("ptr", "ptr", "u16"), (0, 0, 1))  # no such type
    with pytest.raises(LaunchError, match="CUDA_ERROR_INVALID_VALUE") as info:
        kernel.launch((1, 1, 1), (2048, 1, 1), ("ptr", "ptr", "i64"), (0, 0, 0))
    assert info.value.result_name == "CUDA_ERROR_INVALID_VALUE"


DYN_SMEM = r"""
extern "C" __global__ void dyn_smem(const float* x, float* out, int n_smem) {
  extern __shared__ float buf[];
  for (int i = threadIdx.x; i < n_smem; i += blockDim.x) buf[i] = x[i];
  __syncthreads();
  float acc = 0.0f;
  for (int i = threadIdx.x; i < n_smem; i += blockDim.x) acc += buf[n_smem - 1 - i];
  __shared__ float red[32];
  acc = fc_block_reduce(acc, fc_op_sum<float>(), red);
  if (threadIdx.x == 0) out[0] = acc;
}
"""


def test_dynamic_shared_memory_above_48k():
    profile = current_profile()
    smem = min(profile.smem_per_block_optin - 1024, 200 * 1024)
    if smem <= 48 * 1024:
        pytest.skip("this GPU has no opt-in shared memory above 48 KiB")
    n = smem // 4
    x = torch.randn(n, device=CUDA)
    out = torch.empty(1, device=CUDA)
    _kernel("dyn_smem", DYN_SMEM).launch((1, 1, 1), (256, 1, 1), ("ptr", "ptr", "i32"),
                                         (x.data_ptr(), out.data_ptr(), n), shared_mem=smem)
    torch.testing.assert_close(out[0], x.sum(), rtol=1e-4, atol=1e-3)


def test_explicit_stream_and_other_thread():
    n = 4096
    x = torch.randn(n, device=CUDA)
    y = torch.empty_like(x)
    kernel = _kernel("gelu_tanh", GELU)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    kernel.launch(_grid(n, 256), (256, 1, 1), ("ptr", "ptr", "i64"),
                  (x.data_ptr(), y.data_ptr(), n), stream=side.cuda_stream)
    side.synchronize()
    torch.testing.assert_close(y, torch.nn.functional.gelu(x, approximate="tanh"))

    z = torch.empty_like(x)
    torch.cuda.synchronize()
    errors = []

    def worker():  # a fresh thread starts with no current CUDA context
        try:
            kernel.launch(_grid(n, 256), (256, 1, 1), ("ptr", "ptr", "i64"),
                          (x.data_ptr(), z.data_ptr(), n), stream=0)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    torch.cuda.synchronize()
    assert not errors, errors
    torch.testing.assert_close(z, y)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_launch_on_a_device_other_than_the_current_one():
    n = 10_000
    cubin = _cubin(GELU)
    current = torch.cuda.current_device()
    for d in range(torch.cuda.device_count()):
        x = torch.randn(n, device=f"cuda:{d}")
        y = torch.empty_like(x)
        kernel = load_kernel(cubin, "gelu_tanh", d)
        assert kernel.device_index == d
        assert load_kernel(cubin, "gelu_tanh", d) is kernel
        # No stream given: device d's current stream, while torch's current device stays put.
        kernel.launch(_grid(n, 256), (256, 1, 1), ("ptr", "ptr", "i64"),
                      (x.data_ptr(), y.data_ptr(), n))
        assert torch.cuda.current_device() == current
        torch.cuda.synchronize(d)
        torch.testing.assert_close(y, torch.nn.functional.gelu(x, approximate="tanh"))
        with torch.cuda.device((d + 1) % torch.cuda.device_count()):
            z = torch.empty_like(x)
            kernel.launch(_grid(n, 256), (256, 1, 1), ("ptr", "ptr", "i64"),
                          (x.data_ptr(), z.data_ptr(), n))
            torch.cuda.synchronize(d)
        torch.testing.assert_close(z, y)


def test_loading_twice_returns_the_cached_kernel():
    cubin = _cubin(GELU)
    first = load_kernel(cubin, "gelu_tanh")
    assert load_kernel(bytes(cubin), "gelu_tanh") is first
    assert load_kernel(cubin, "gelu_tanh", torch.cuda.current_device()) is first
    assert first.num_regs > 0
    with pytest.raises(ModuleLoadError) as info:
        load_kernel(cubin, "no_such_kernel")
    assert info.value.result_name == "CUDA_ERROR_NOT_FOUND"


def test_bad_or_foreign_cubin_is_a_module_load_error():
    with pytest.raises(ModuleLoadError):
        load_kernel(b"\x7fELF" + b"\x00" * 64, "k")
    other = 80 if _arch() != 80 else 90
    foreign = compile_cubin(prelude_source("math") + GELU, other)
    with pytest.raises(ModuleLoadError) as info:
        load_kernel(foreign, "gelu_tanh")
    print(f"sm_{other} cubin on sm_{_arch()}: {info.value.result_name}")


def test_current_profile_matches_named_profile():
    profile = current_profile()
    print(profile)
    assert profile.arch == _arch()
    assert profile.sm_count == torch.cuda.get_device_properties(0).multi_processor_count
    if profile.name in ("h100", "h200", "a100"):
        named = profile_by_name(profile.name)
        for field in ("arch", "sm_count", "max_threads_per_block", "max_threads_per_sm",
                      "regs_per_block", "regs_per_sm", "smem_per_block", "smem_per_block_optin",
                      "smem_per_sm", "l2_bytes", "supports_clusters", "max_blocks_per_sm",
                      "smem_reserved_per_block", "warp_size"):
            assert getattr(profile, field) == getattr(named, field), field


def test_launch_overhead_report():
    kernel = _kernel("gelu_tanh", GELU)
    x = torch.randn(1024, device=CUDA)
    y = torch.empty_like(x)
    types, args = ("ptr", "ptr", "i64"), (x.data_ptr(), y.data_ptr(), 1024)
    stream = torch.cuda.current_stream().cuda_stream
    for _ in range(200):
        kernel.launch((4, 1, 1), (256, 1, 1), types, args)
    torch.cuda.synchronize()
    n = 20_000
    results = {}
    for label, kwargs in (("current stream", {}), ("explicit stream", {"stream": stream})):
        start = time.perf_counter()
        for _ in range(n):
            kernel.launch((4, 1, 1), (256, 1, 1), types, args, **kwargs)
        results[label] = (time.perf_counter() - start) / n * 1e6
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        torch.mul(x, 2.0, out=y)
    eager = (time.perf_counter() - start) / n * 1e6
    torch.cuda.synchronize()
    print("host time per launch: " + ", ".join(f"{k} {v:.2f} us" for k, v in results.items())
          + f"; torch.mul(out=) {eager:.2f} us")
