"""The Fusion IR: tensors with iteration domains and the expressions between them, built
from a definition's records and printed in nvFuser's notation:

    T3_l[ iS6{i0}, bS7{1} ] = broadcast( T1_g[ iS2{i0} ], is_broadcast_dim = [False, True] )

`iS` iterates, `bS` broadcasts (`{1 ex N}` when expanded to N), `rS` is reduced; `_g` marks
fusion inputs and outputs (global memory), `_l` intermediates.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fusion_cache.frontend.dtypes import DataType
from fusion_cache.frontend.printer import format_value
from fusion_cache.frontend.records import Ref
from fusion_cache.frontend.values import ScalarInfo, TensorInfo, VectorInfo

if TYPE_CHECKING:
    from fusion_cache.frontend.definition import FusionDefinition

CUDA_NAMES = {
    DataType.Double: "double", DataType.Float: "float", DataType.Half: "__half",
    DataType.BFloat16: "__bfloat", DataType.Int: "int64_t", DataType.Int32: "int",
    DataType.Bool: "bool", DataType.ComplexFloat: "std::complex<float>",
    DataType.ComplexDouble: "std::complex<double>", DataType.UInt64: "uint64_t",
    DataType.Float8_e4m3fn: "__e4m3", DataType.Float8_e5m2: "__e5m2",
    DataType.Float8_e8m0fnu: "__e8m0", DataType.Float4_e2m1fn: "__e2m1",
    DataType.Float4_e2m1fn_x2: "__e2m1_x2",
}  # fmt: skip

INFIX = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "div": "/"}


@dataclass
class IterDomain:
    id: int
    kind: str  # 'i' iteration, 'b' broadcast, 'r' reduction
    extent: Any  # int or a symbol such as 'i0'
    expanded: Any = None  # a broadcast dim expanded to this extent

    def __str__(self) -> str:
        ext = str(self.extent) if self.expanded is None else f"1 ex {self.expanded}"
        return f"{self.kind}S{self.id}{{{ext}}}"


@dataclass
class TensorView:
    index: int
    dtype: DataType
    domain: list[IterDomain]
    memory: str = "l"

    @property
    def logical(self) -> list[IterDomain]:
        return [d for d in self.domain if d.kind != "r"]

    def __str__(self) -> str:
        dims = ", ".join(str(d) for d in self.domain)
        return f"T{self.index}_{self.memory}[ {dims} ]"


@dataclass
class Expr:
    op: str
    inputs: list[Any]
    outputs: list[Any]
    attrs: list[tuple[str, Any]] = field(default_factory=list)


@dataclass
class Fusion:
    inputs: list[Any]
    outputs: list[Any]
    exprs: list[Expr]
    vals: dict[int, Any]


class _Builder:
    def __init__(self, fd: FusionDefinition) -> None:
        self.fd = fd
        self.next_id = 0
        self.next_sym = 0
        self.next_tv = len(fd._infos)
        self.vals: dict[int, Any] = {}
        self.exprs: list[Expr] = []

    def dom(self, kind: str, extent: Any, expanded: Any = None) -> IterDomain:
        d = IterDomain(self.next_id, kind, extent, expanded)
        self.next_id += 1
        return d

    def symbol(self) -> str:
        s = f"i{self.next_sym}"
        self.next_sym += 1
        return s

    def extent_for(self, code: int) -> IterDomain:
        if code == 1:
            return self.dom("b", 1)
        return self.dom("i", self.symbol() if code == -1 else code)

    def copy_dom(self, d: IterDomain, kind: str | None = None) -> IterDomain:
        return self.dom(kind or d.kind, d.extent, d.expanded)

    def tv(self, index: int, domain: list[IterDomain]) -> TensorView:
        info = self.fd._infos[index]
        tv = TensorView(index, info.dtype, domain)
        self.vals[index] = tv
        return tv

    def temp(self, dtype: DataType, domain: list[IterDomain]) -> TensorView:
        tv = TensorView(self.next_tv, dtype, domain)
        self.next_tv += 1
        return tv

    def val(self, v: Any) -> Any:
        if isinstance(v, Ref):
            return self.vals[v.index]
        if isinstance(v, tuple):
            return tuple(self.val(x) for x in v)
        return v


def _merge_elementwise(b: _Builder, operands: list[Any], rank: int) -> list[IterDomain]:
    tvs = [o for o in operands if isinstance(o, TensorView)]
    out = []
    for pos in range(rank):
        chosen = None
        for tv in tvs:
            logical = tv.logical
            d = pos - rank + len(logical)
            if d < 0:
                continue
            cand = logical[d]
            if chosen is None or (chosen.kind == "b" and cand.kind != "b"):
                chosen = cand
        out.append(b.copy_dom(chosen) if chosen is not None else b.dom("b", 1))
    return out


def _shape_domains(b: _Builder, out_info: TensorInfo) -> list[IterDomain]:
    return [b.extent_for(code) for code in out_info.shape]


def build_fusion(fd: FusionDefinition) -> Fusion:
    b = _Builder(fd)
    infos = fd._infos
    inputs: list[Any] = []
    for r in fd._records:
        if r.kind == "tensor":
            idx = r.outputs[0].index
            tv = b.tv(idx, _shape_domains(b, infos[idx]))
            tv.memory = "g"
            inputs.append(tv)
        elif r.kind in ("scalar", "vector"):
            idx = r.outputs[0].index
            b.vals[idx] = r.outputs[0]
            if r.kw("is_input"):
                inputs.append(r.outputs[0])
        elif r.kind == "op":
            _build_op(b, r, infos)
    outputs = []
    for r in fd.output_records():
        val = b.vals[r.args[0].index]
        if isinstance(val, TensorView):
            val.memory = "g"
        outputs.append(val)
    return Fusion(inputs, outputs, b.exprs, b.vals)


def _build_op(b: _Builder, r, infos) -> None:
    ins = [b.val(a) for a in r.args]
    attrs = [(k, v) for k, v in r.kwargs]
    outs = []
    name = r.name
    for ref in r.outputs:
        info = infos[ref.index]
        if not isinstance(info, TensorInfo):
            b.vals[ref.index] = ref
            outs.append(ref)
    tensor_outs = [ref for ref in r.outputs if isinstance(infos[ref.index], TensorInfo)]
    if not tensor_outs:
        b.exprs.append(Expr(name, ins, outs, attrs))
        return
    first = ins[0] if ins else None
    if name in ("sum", "prod", "max", "min", "var", "var_mean", "welford"):
        src: TensorView = first
        logical = src.logical
        axes = {d % max(len(logical), 1) for d in r.kw("dims")}
        dom = [b.copy_dom(d, "r" if i in axes else None) for i, d in enumerate(logical)]
        keep = r.kw("keepdim", False)
        results = []
        for ref in tensor_outs:
            d = [b.copy_dom(x) for x in dom]
            results.append(b.temp(infos[ref.index].dtype, d) if keep else b.tv(ref.index, d))
        b.exprs.append(Expr(name, ins, results, attrs))
        if keep:
            for tmp, ref in zip(results, tensor_outs):
                flags = [x.kind == "r" for x in tmp.domain]
                dom2 = [b.dom("b", 1) if x.kind == "r" else b.copy_dom(x) for x in tmp.domain]
                b.exprs.append(Expr("broadcast", [tmp], [b.tv(ref.index, dom2)],
                                    [("is_broadcast_dim", tuple(flags))]))  # fmt: skip
        return
    if name == "broadcast":
        it = iter(first.logical)
        dom = [b.dom("b", 1) if f else b.copy_dom(next(it)) for f in r.kw("is_broadcast_dim")]
        b.exprs.append(Expr(name, ins, [b.tv(tensor_outs[0].index, dom)], attrs))
        return
    if name in ("broadcast_in_dim", "expand"):
        out_info = infos[tensor_outs[0].index]
        logical = first.logical
        if name == "expand":
            mapping = dict(enumerate(range(len(logical))))
        else:
            mapping = {dst % len(out_info.shape): src for src, dst in enumerate(r.kw("broadcast_dims"))}
        dom = []
        for j, code in enumerate(out_info.shape):
            src = logical[mapping[j]] if j in mapping else None
            if src is not None and src.kind != "b":
                dom.append(b.copy_dom(src))
            elif code == 1:
                dom.append(b.dom("b", 1))
            else:
                dom.append(b.dom("b", 1, expanded=b.symbol() if code == -1 else code))
        b.exprs.append(Expr(name, ins, [b.tv(tensor_outs[0].index, dom)], attrs))
        return
    if name == "permute":
        logical = first.logical
        dom = [b.copy_dom(logical[d % len(logical)]) for d in r.kw("dims")]
        b.exprs.append(Expr(name, ins, [b.tv(tensor_outs[0].index, dom)], attrs))
        return
    if name == "squeeze":
        logical = first.logical
        drop = {d % len(logical) for d in r.kw("dims")}
        dom = [b.copy_dom(d) for i, d in enumerate(logical) if i not in drop]
        b.exprs.append(Expr(name, ins, [b.tv(tensor_outs[0].index, dom)], attrs))
        return
    from fusion_cache.frontend.ops.table import OPS

    if name in OPS or name == "cast":
        rank = infos[tensor_outs[0].index].ndim
        dom = _merge_elementwise(b, [x for x in ins if isinstance(x, TensorView)], rank)
        b.exprs.append(Expr(name, ins, [b.tv(tensor_outs[0].index, dom)], attrs))
        return
    # shape-making ops (reshape, slice, pad, cat, full, iota, batch_norm): fresh extents
    results = []
    for ref in tensor_outs:
        info = infos[ref.index]
        if name == "batch_norm" and ref is tensor_outs[0]:
            results.append(b.tv(ref.index, [b.copy_dom(d) for d in first.logical]))
        else:
            results.append(b.tv(ref.index, _shape_domains(b, info)))
    b.exprs.append(Expr(name, ins, results, attrs))


def _fmt_operand(v: Any) -> str:
    if isinstance(v, TensorView):
        return str(v)
    if isinstance(v, tuple):
        return "[" + ", ".join(_fmt_operand(x) for x in v) + "]"
    return format_value(v)


def format_expr(e: Expr) -> str:
    lhs = ", ".join(_fmt_operand(o) for o in e.outputs)
    if e.op in INFIX and len(e.inputs) == 2 and not e.attrs:
        a, c = (_fmt_operand(x) for x in e.inputs)
        return f"{lhs}\n   = {a}\n   {INFIX[e.op]} {c};"
    parts = [_fmt_operand(x) for x in e.inputs if x is not None]
    parts += [f"{k} = {_fmt_operand(v)}" for k, v in e.attrs if v is not None]
    return f"{lhs} = {e.op}( {', '.join(parts)} )"


def _fmt_io(v: Any, fusion: Fusion) -> str:
    if isinstance(v, TensorView):
        return f"  {v}, {CUDA_NAMES[v.dtype]}"
    return f"  {v}"


def format_fusion(fusion: Fusion) -> str:
    lines = ["Inputs:"]
    lines += [_fmt_io(v, fusion) for v in fusion.inputs]
    lines.append("Outputs:")
    lines += [_fmt_io(v, fusion) for v in fusion.outputs]
    lines.append("")
    lines.append("%kernel_math {")
    lines += [format_expr(e) for e in fusion.exprs]
    lines.append("} // %kernel_math")
    return "\n".join(lines) + "\n"


__all__ = ["Expr", "Fusion", "IterDomain", "TensorView", "build_fusion", "format_fusion",
           "ScalarInfo", "VectorInfo"]  # fmt: skip
