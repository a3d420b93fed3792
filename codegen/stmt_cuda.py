"""One statement of a lowered program -> one CUDA declaration, shared by every kernel family.

Note [Register types]: half and bfloat16 values live in float registers; a cast to them
rounds through storage, and stores convert back.
"""
from __future__ import annotations

from collections.abc import Callable

from fusion_cache.frontend.dtypes import DataType

from .cuda_ops import MEMORY_TYPE, REGISTER_TYPE, convert, literal, render_op


def decl(ctype: str, var: str, expr: str) -> str:
    return " ".join(("const", ctype, var, "=", expr)) + ";"


def widen(raw: str, dtype: DataType) -> str:
    """A value read from memory, in its register type."""
    if MEMORY_TYPE[dtype] in ("fc_half", "fc_bf16"):
        return f"fc_to_float({raw})"
    return raw


def to_memory(var: str, dtype: DataType) -> str:
    mt = MEMORY_TYPE[dtype]
    if mt == "fc_half":
        return f"fc_to_half({var})"
    if mt == "fc_bf16":
        return f"fc_to_bf16({var})"
    return var


def render_stmt(stmt, dtypes: dict[str, DataType], load: Callable[[int], str]) -> str:
    """`load(i)` gives the raw memory expression of access i (before widening)."""
    rt = REGISTER_TYPE[stmt.dtype]
    attrs = dict(stmt.attrs)
    if stmt.op == "load":
        return decl(rt, stmt.var, widen(load(stmt.operands[0]), stmt.dtype))
    if stmt.op == "const":
        return decl(rt, stmt.var, literal(attrs["value"], stmt.dtype))
    if stmt.op == "param":
        return decl(rt, stmt.var, f"({rt})p{attrs['pos']}")
    if stmt.op == "hostval":
        return decl(rt, stmt.var, f"({rt})h{attrs['state']}")
    if stmt.op == "cast":
        (src,) = stmt.operands
        return decl(rt, stmt.var, convert(src, dtypes[src], stmt.dtype))
    if stmt.op.startswith("welford_"):
        (w,) = stmt.operands
        acc = REGISTER_TYPE[stmt.compute]
        expr = {
            "welford_var": f"fc_welford_var({w}, ({acc}){attrs.get('correction', 0.0)!r})",
            "welford_mean": f"{w}.mean",
            "welford_m2": f"{w}.m2",
            "welford_count": f"(long long){w}.count",
        }[stmt.op]
        src_dtype = DataType.Int if stmt.op == "welford_count" else stmt.compute
        return decl(rt, stmt.var, convert(expr, src_dtype, stmt.dtype))
    compute = stmt.compute
    args = []
    for k, v in enumerate(stmt.operands):
        target = DataType.Bool if (stmt.op == "where" and k == 0) else compute
        args.append(convert(v, dtypes[v], target))
    expr = render_op(stmt.op, args, compute)
    if compute is not None and REGISTER_TYPE[compute] != REGISTER_TYPE[stmt.dtype]:
        expr = convert(expr, compute, stmt.dtype)
    return decl(rt, stmt.var, expr)


def scalar_param(dtype: DataType) -> tuple[str, str]:
    """(C type, launch arg type) of a scalar kernel parameter."""
    if dtype is DataType.Bool:
        return "bool", "bool"
    if dtype in (DataType.Int, DataType.Int32):
        return "long long", "i64"
    return "double", "f64"


def scalar_params(program) -> list[str]:
    out = [" ".join((scalar_param(dt)[0], f"p{pos}")) for pos, dt in program.scalar_inputs]
    out += [" ".join((scalar_param(dt)[0], f"h{state}")) for state, dt in program.host_scalars]
    return out


def scalar_arg_types(program) -> tuple[str, ...]:
    return tuple(scalar_param(dt)[1] for _, dt in (*program.scalar_inputs, *program.host_scalars))
