"""One statement of a lowered program -> one CUDA declaration, shared by every kernel family.

Note [Register types]: half and bfloat16 values live in float registers; a cast to them
rounds through storage, and stores convert back.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fusion_cache.frontend.dtypes import COMPLEX, DataType, real_part

from .cuda_ops import (
    COMPLEX_TO_BOOL,
    COMPLEX_TO_REAL,
    MEMORY_TYPE,
    NARROW_FLOAT,
    RANDOM_STMTS,
    REGISTER_TYPE,
    convert,
    literal,
    render_op,
)


def decl(ctype: str, var: str, expr: str) -> str:
    return " ".join(("const", ctype, var, "=", expr)) + ";"


def widen(raw: str, dtype: DataType) -> str:
    """A value read from memory, in its register type."""
    if MEMORY_TYPE[dtype] in NARROW_FLOAT:
        return f"fc_to_float({raw})"
    return raw


def to_memory(var: str, dtype: DataType) -> str:
    narrow = NARROW_FLOAT.get(MEMORY_TYPE[dtype])
    return f"{narrow}({var})" if narrow else var


def stored_form(program: Any, dtypes: dict, var: str, dtype: DataType) -> str:
    """The memory form of `var`. A float value cast down to the stored 16-bit dtype is stored
    from the float: rounding once more would give the same bits after two more conversions."""
    st = next(s for s in program.stmts if s.var == var)
    if st.op == "cast" and st.dtype is dtype and MEMORY_TYPE[dtype] in ("fc_half", "fc_bf16"):
        (src,) = st.operands
        if REGISTER_TYPE[dtypes[src]] == "float":
            return to_memory(src, dtype)
    return to_memory(var, dtype)


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
    if stmt.op in RANDOM_STMTS:  # Note [Philox numbers]
        a, b, seed, offset = stmt.operands
        lo, hi = (convert(x, dtypes[x], stmt.compute) for x in (a, b))
        return decl(rt, stmt.var, f"fc_rng_{stmt.op}({stmt.var}_rc, (unsigned long long)({seed}), "
                                  f"(unsigned long long)({offset}), FC_ELEM_INDEX, {lo}, {hi}, "
                                  "FC_ELEM_LANE)")  # fmt: skip
    if stmt.op == "complex":  # Note [Complex sums]: two real parts joined
        re, im = stmt.operands
        return decl(rt, stmt.var, f"fc_make_complex<{REGISTER_TYPE[stmt.compute]}>({re}, {im})")
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
    made = compute  # the type of `expr`: not complex for some ops of complex values
    if compute in COMPLEX and stmt.op in COMPLEX_TO_REAL:
        made = real_part(compute)
    elif compute in COMPLEX and stmt.op in COMPLEX_TO_BOOL:
        made = DataType.Bool
    if made is not None and REGISTER_TYPE[made] != REGISTER_TYPE[stmt.dtype]:
        expr = convert(expr, made, stmt.dtype)
    return decl(rt, stmt.var, expr)


def scalar_param(dtype: DataType) -> tuple[str, str]:
    """(C type, launch arg type) of a scalar kernel parameter."""
    if dtype is DataType.Bool:
        return "bool", "bool"
    if dtype is DataType.UInt64:
        return "unsigned long long", "u64"
    if dtype in (DataType.Int, DataType.Int32):
        return "long long", "i64"
    return "double", "f64"


def scalar_params(program) -> list[str]:
    out = [" ".join((scalar_param(dt)[0], f"p{pos}")) for pos, dt in program.scalar_inputs]
    out += [" ".join((scalar_param(dt)[0], f"h{state}")) for state, dt in program.host_scalars]
    return out


def scalar_arg_types(program) -> tuple[str, ...]:
    return tuple(scalar_param(dt)[1] for _, dt in (*program.scalar_inputs, *program.host_scalars))
