"""from_torchscript: each supported op against the scripted function on fresh random inputs."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fusion_cache.frontends import UnsupportedOpError, from_torchscript

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")

# ---- one scripted function per op (TorchScript needs them at module level) -----------------


def f_add_alpha(x: torch.Tensor, y: torch.Tensor):
    return torch.add(x, y, alpha=2.5)


def f_sub_alpha(x: torch.Tensor, y: torch.Tensor):
    return torch.sub(x, y, alpha=0.5)


def f_rsub(x: torch.Tensor, y: torch.Tensor):
    return 1.0 - x


def f_mul_div(x: torch.Tensor, y: torch.Tensor):
    return x * y / (y.abs() + 1.0)


def f_div_trunc(x: torch.Tensor, y: torch.Tensor):
    return torch.div(x * 4.0, y.abs() + 0.5, rounding_mode="trunc")


def f_div_floor(x: torch.Tensor, y: torch.Tensor):
    return torch.div(x * 4.0, y.abs() + 0.5, rounding_mode="floor")


def f_unary(x: torch.Tensor, y: torch.Tensor):
    a = torch.exp(-x) + torch.log(x.abs() + 1.0) + torch.sqrt(x.abs())
    return a + torch.rsqrt(y.abs() + 0.1) + torch.abs(y) + torch.sin(x)


def f_pow(x: torch.Tensor, y: torch.Tensor):
    return torch.pow(x, 2.0) + torch.pow(x.abs() + 0.5, y)


def f_compare(x: torch.Tensor, y: torch.Tensor):
    return x == y, x != y, x < y, x <= y, x > y, x >= y


def f_compare_scalar(x: torch.Tensor, y: torch.Tensor):
    return (x > 0.0) & (y <= 0.5)


def f_max_min(x: torch.Tensor, y: torch.Tensor):
    return torch.maximum(x, y) - torch.minimum(x, y)


def f_clamp(x: torch.Tensor, y: torch.Tensor):
    return torch.clamp(x, -0.5, 0.5) + torch.clamp(y, min=0.1) + torch.clamp(x, max=0.2)


def f_relu(x: torch.Tensor, y: torch.Tensor):
    return torch.relu(x) + F.leaky_relu(y, 0.1)


def f_gelu(x: torch.Tensor, y: torch.Tensor):
    return F.gelu(x)


def f_gelu_tanh(x: torch.Tensor, y: torch.Tensor):
    return F.gelu(x, approximate="tanh")


def f_sigmoid_tanh(x: torch.Tensor, y: torch.Tensor):
    return torch.sigmoid(x) * torch.tanh(y)


def f_where(x: torch.Tensor, y: torch.Tensor):
    return torch.where(x > y, x, y) + torch.where(x > 0.0, x, 0.0)


def f_masked_fill(x: torch.Tensor, y: torch.Tensor):
    return x.masked_fill(y > 0.0, -1.0)


def f_to(x: torch.Tensor, y: torch.Tensor):
    return (x * 3.0).to(torch.float64) + 1.0, (y > 0).to(torch.float32), x.type_as(y.double())


def f_sum(x: torch.Tensor, y: torch.Tensor):
    return torch.sum(x, dim=[1], keepdim=True) + y, torch.sum(x)


def f_mean(x: torch.Tensor, y: torch.Tensor):
    return torch.mean(x, dim=[-1]), x.mean()


def f_amax(x: torch.Tensor, y: torch.Tensor):
    return torch.amax(x, dim=[1]), torch.amin(y, dim=[0], keepdim=True)


def f_var(x: torch.Tensor, y: torch.Tensor):
    return torch.var(x, dim=[1], unbiased=False), torch.var(y, dim=[0], keepdim=True)


def f_softmax(x: torch.Tensor, y: torch.Tensor):
    return torch.softmax(x, dim=-1), torch.log_softmax(y, dim=0)


def f_layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor):
    return F.layer_norm(x, [x.size(-1)], w, b, 1e-5)


def f_layer_norm_no_affine(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor):
    return F.layer_norm(x, [6], None, None, 1e-6)


def f_native_layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor):
    out, mean, rstd = torch.native_layer_norm(x, [6], w, b, 1e-5)
    return out, mean, rstd


def f_dropout_eval(x: torch.Tensor, y: torch.Tensor):
    return F.dropout(x, 0.5, training=False) + y


def f_view(x: torch.Tensor, y: torch.Tensor):
    return x.view(-1) + 1.0, x.reshape(x.size(0), 2, 3) * 2.0


def f_permute(x: torch.Tensor, y: torch.Tensor):
    return x.permute(1, 0) * 2.0, y.t() + 1.0, x.transpose(0, 1)


def f_unsqueeze_squeeze(x: torch.Tensor, y: torch.Tensor):
    a = x.unsqueeze(1) * y.unsqueeze(0)  # [4, 1, 6] * [1, 4, 6]
    return a.sum(dim=[1]), x.unsqueeze(-1).squeeze(-1) + 1.0


def f_expand(x: torch.Tensor, y: torch.Tensor):
    return x.unsqueeze(0).expand(3, -1, -1) + 1.0, x.expand_as(y) * 2.0


def f_flatten(x: torch.Tensor, y: torch.Tensor):
    return torch.flatten(x.unsqueeze(0), 1) * 2.0


XY = "xy"  # two [4, 6] tensors
NORM = "norm"  # x [4, 6], weight [6], bias [6]

CASES = [
    (f_add_alpha, XY), (f_sub_alpha, XY), (f_rsub, XY), (f_mul_div, XY), (f_div_trunc, XY),
    (f_div_floor, XY), (f_unary, XY), (f_pow, XY), (f_compare, XY), (f_compare_scalar, XY),
    (f_max_min, XY), (f_clamp, XY), (f_relu, XY), (f_gelu, XY), (f_gelu_tanh, XY),
    (f_sigmoid_tanh, XY), (f_where, XY), (f_masked_fill, XY), (f_to, XY), (f_sum, XY),
    (f_mean, XY), (f_amax, XY), (f_var, XY), (f_softmax, XY), (f_layer_norm, NORM),
    (f_layer_norm_no_affine, NORM), (f_native_layer_norm, NORM), (f_dropout_eval, XY),
    (f_view, XY), (f_permute, XY), (f_unsqueeze_squeeze, XY), (f_expand, XY), (f_flatten, XY),
]  # fmt: skip


def _inputs(kind: str, dtype: torch.dtype, rows: int = 4) -> list[torch.Tensor]:
    if kind == NORM:
        return [torch.randn(rows, 6, dtype=dtype), torch.randn(6, dtype=dtype),
                torch.randn(6, dtype=dtype)]  # fmt: skip
    return [torch.randn(rows, 6, dtype=dtype), torch.randn(rows, 6, dtype=dtype)]


def _as_list(out) -> list[torch.Tensor]:
    return list(out) if isinstance(out, tuple) else [out]


def _check(fd, scripted, inputs) -> None:
    got = fd.execute(inputs)
    want = _as_list(scripted(*inputs))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if w.dtype == torch.bool:
            assert torch.equal(g, w)
        else:
            tol = 1e-5 if w.dtype == torch.float32 else 1e-12
            torch.testing.assert_close(g, w, rtol=tol, atol=tol)


@pytest.mark.parametrize("fn,kind", CASES, ids=[c[0].__name__ for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_op_matches_torchscript(fn, kind, dtype):
    scripted = torch.jit.script(fn)
    fd = from_torchscript(scripted.graph, _inputs(kind, dtype))
    _check(fd, scripted, _inputs(kind, dtype))  # fresh inputs


def test_sizes_stay_symbolic():
    scripted = torch.jit.script(f_view)
    fd = from_torchscript(scripted.graph, _inputs(XY, torch.float32, rows=4))
    _check(fd, scripted, _inputs(XY, torch.float32, rows=7))  # another row count, same fusion


def test_ir_text_with_types_needs_no_examples():
    ir = """graph(%x : Float(2, 3, strides=[3, 1], requires_grad=0, device=cpu),
          %y : Float(1, 3, strides=[3, 1], requires_grad=0, device=cpu)):
      %one : int = prim::Constant[value=1]()
      %z : Tensor = aten::add(%x, %y, %one)
      %w : Tensor = aten::tanh(%z)
      return (%w)"""
    fd = from_torchscript(ir)
    assert "broadcast" in fd.fusion_ir() or "bS" in fd.fusion_ir()  # y's size-1 dim
    x, y = torch.randn(5, 3), torch.randn(1, 3)
    torch.testing.assert_close(fd.execute([x, y])[0], torch.tanh(x + y))


def test_untyped_ir_without_examples_asks_for_them():
    ir = """graph(%x : Tensor):
      %w : Tensor = aten::relu(%x)
      return (%w)"""
    with pytest.raises(ValueError, match="example_inputs"):
        from_torchscript(ir)


def test_scalar_graph_input():
    def f(x: torch.Tensor, s: float):
        return x * s + 1.0

    scripted = torch.jit.script(f)
    x = torch.randn(3, 4)
    fd = from_torchscript(scripted.graph, [x, 0.0])  # a float input becomes a scalar input
    torch.testing.assert_close(fd.execute([x, 2.5])[0], scripted(x, 2.5))


def test_unsupported_op_names_op_and_line():
    def f(x: torch.Tensor, y: torch.Tensor):
        z = x + y
        return torch.cummax(z, 0)[0]

    scripted = torch.jit.script(f)
    with pytest.raises(UnsupportedOpError) as info:
        from_torchscript(scripted.graph, [torch.randn(3, 3), torch.randn(3, 3)])
    message = str(info.value)
    assert "aten::cummax" in message
    assert "torch.cummax(z, 0)" in message  # the source line
    assert isinstance(info.value, NotImplementedError) and isinstance(info.value, ValueError)


def test_unsupported_op_in_ir_text_names_ir_line():
    ir = """graph(%x : Float(2, 3, strides=[3, 1], requires_grad=0, device=cpu)):
      %dim : int = prim::Constant[value=1]()
      %none : NoneType = prim::Constant()
      %w : Tensor = aten::cumsum(%x, %dim, %none)
      return (%w)"""
    with pytest.raises(NotImplementedError, match=r"aten::cumsum(.|\n)*aten::cumsum\(%x"):
        from_torchscript(ir)


def test_dropout_in_training_is_refused():
    def f(x: torch.Tensor):
        return F.dropout(x, 0.5, training=True)

    with pytest.raises(UnsupportedOpError, match="dropout"):
        from_torchscript(torch.jit.script(f).graph, [torch.randn(2, 2)])


# ---- seed document 001: two batch norms, an add with alpha and a relu ----------------------


def seed_001(x: torch.Tensor, rm1: torch.Tensor, rv1: torch.Tensor, w1: torch.Tensor,
             b1: torch.Tensor, rm2: torch.Tensor, rv2: torch.Tensor, w2: torch.Tensor,
             b2: torch.Tensor):  # fmt: skip
    a = F.batch_norm(x, rm1, rv1, w1, b1, False, 0.1, 1e-5)
    b = F.batch_norm(x, rm2, rv2, w2, b2, False, 0.1, 1e-5)
    return torch.relu(torch.add(a, b, alpha=1))


def _seed_inputs(dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    c = 3
    stats = [torch.randn(c, dtype=dtype), torch.rand(c, dtype=dtype) + 0.5,
             torch.randn(c, dtype=dtype), torch.randn(c, dtype=dtype)]  # fmt: skip
    stats2 = [torch.randn(c, dtype=dtype), torch.rand(c, dtype=dtype) + 0.5,
              torch.randn(c, dtype=dtype), torch.randn(c, dtype=dtype)]  # fmt: skip
    return [torch.randn(2, c, 4, 5, dtype=dtype), *stats, *stats2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_seed_001_batch_norms_add_relu(dtype, capsys):
    scripted = torch.jit.script(seed_001)
    fd = from_torchscript(scripted.graph, _seed_inputs(dtype))
    ir = fd.fusion_ir()
    print(ir)
    for piece in ("broadcast(", "rsqrt(", " * ", " + ", "relu("):
        assert piece in ir, piece
    assert len(fd.inputs()) == 9
    _check(fd, scripted, _seed_inputs(dtype))


def test_seed_001_native_batch_norm_ir():
    ir = """graph(%x : Float(2, 3, 4, 5, strides=[60, 20, 5, 1], requires_grad=0, device=cpu),
          %w : Float(3, strides=[1], requires_grad=0, device=cpu),
          %b : Float(3, strides=[1], requires_grad=0, device=cpu),
          %rm : Float(3, strides=[1], requires_grad=0, device=cpu),
          %rv : Float(3, strides=[1], requires_grad=0, device=cpu)):
      %false : bool = prim::Constant[value=0]()
      %momentum : float = prim::Constant[value=0.1]()
      %eps : float = prim::Constant[value=1e-05]()
      %one : int = prim::Constant[value=1]()
      %y : Tensor, %m : Tensor, %s : Tensor = aten::native_batch_norm(
          %x, %w, %b, %rm, %rv, %false, %momentum, %eps)
      %z : Tensor = aten::add(%y, %x, %one)
      %r : Tensor = aten::relu(%z)
      return (%r)"""
    fd = from_torchscript(ir)
    x, w, b, rm, rv = torch.randn(2, 3, 4, 5), *(torch.rand(3) + 0.5 for _ in range(4))
    want = torch.relu(F.batch_norm(x, rm, rv, w, b, False, 0.1, 1e-5) + x)
    torch.testing.assert_close(fd.execute([x, w, b, rm, rv])[0], want)


def test_batch_norm_training_updates_running_stats():
    def f(x: torch.Tensor, rm: torch.Tensor, rv: torch.Tensor, w: torch.Tensor, b: torch.Tensor):
        # torch.batch_norm: F.batch_norm's training-mode size check is a loop we do not lower
        return torch.batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5, False)

    scripted = torch.jit.script(f)
    ins = [torch.randn(4, 3, 5), torch.zeros(3), torch.ones(3), torch.rand(3), torch.rand(3)]
    fd = from_torchscript(scripted.graph, ins)
    mine = [t.clone() for t in ins]
    theirs = [t.clone() for t in ins]
    torch.testing.assert_close(fd.execute(mine)[0], scripted(*theirs))
    torch.testing.assert_close(mine[1], theirs[1])  # running mean updated in place
    torch.testing.assert_close(mine[2], theirs[2])
