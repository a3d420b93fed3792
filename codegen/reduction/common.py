"""What the row, column and outer kernels share: reduction op functors and accumulator
types, kernel parameters, offsets along the reduced dims, and row-level statements."""
from __future__ import annotations

from fusion_cache.frontend.dtypes import DataType

from ..cuda_ops import MEMORY_TYPE, REGISTER_TYPE, convert
from ..kernel_ir import ReductionProgram
from ..stmt_cuda import decl, render_stmt, scalar_params

_IDENTITY = {"sum": "fc_op_sum", "prod": "fc_op_prod", "max": "fc_op_max", "min": "fc_op_min"}


def op_functor(red) -> str:
    rt = REGISTER_TYPE[red.dtype]
    if red.op == "welford":
        return f"fc_op_welford<{rt}, int>()"
    return f"{_IDENTITY[red.op]}<{rt}>()"


def accumulator_type(red) -> str:
    """The C type a reduction accumulates in."""
    rt = REGISTER_TYPE[red.dtype]
    return f"fc_welford<{rt}, int>" if red.op == "welford" else rt


def identity_of(r) -> str:
    """A reduction accumulator's starting value."""
    return (f"fc_welford_init<{REGISTER_TYPE[r.dtype]}, int>()" if r.op == "welford"
            else f"{op_functor(r)}.identity()")  # fmt: skip


def accumulate_stmt(red, value: str, dtypes: dict, acc: str | None = None) -> str:
    acc = acc or red.var
    x = convert(value, dtypes[value], red.dtype)
    if red.op == "welford":
        return f"{acc} = fc_welford_update({acc}, {x});"
    return f"{acc} = {op_functor(red)}({acc}, {x});"


def merged_groups(reds, merge: bool = True) -> list[list]:
    """Reductions combined together (Note [Merged row reductions] in prelude/reduce.cuh):
    those of one scalar accumulator type; Welford triples, and all with `merge` off, go alone."""
    groups: dict[str, list] = {}
    for r in reds:
        groups.setdefault(r.var if r.op == "welford" or not merge else accumulator_type(r),
                          []).append(r)  # fmt: skip
    return list(groups.values())


def row_level_stmts(program: ReductionProgram, stage: int, dtypes: dict, load,
                    render=None) -> list[str]:  # fmt: skip
    """The row-level statements computed after `stage`'s reductions; `render(st, load)`
    instead of render_stmt where given."""
    stage_of = dict(program.stage_of)
    out = []
    for st in program.stmts:
        if st.op == "reduce" or st.var in program.element_vars or stage_of[st.var] != stage:
            continue
        out.append(render(st, load) if render is not None else render_stmt(st, dtypes, load))
    return out


def row_divisions(program: ReductionProgram) -> dict[str, tuple[str, str]]:
    """Element-level float divisions by a row-level value: var -> (divisor, C type), rendered
    as multiplications by the divisor's reciprocal (Note [Row divisors], prelude/math.cuh)."""
    out = {}
    for st in program.stmts:
        if st.op not in ("div", "truediv") or st.compute is None:
            continue
        ct = REGISTER_TYPE[st.compute]
        x, y = st.operands
        if ct in ("float", "double") and x in program.element_vars and (
                y not in program.element_vars):  # fmt: skip
            out[st.var] = (y, ct)
    return out


def render_row_division(st, dtypes: dict) -> str:
    x, y = st.operands
    expr = f"fc_div_by({convert(x, dtypes[x], st.compute)}, {y}_d)"
    if REGISTER_TYPE[st.compute] != REGISTER_TYPE[st.dtype]:
        expr = convert(expr, st.compute, st.dtype)
    return decl(REGISTER_TYPE[st.dtype], st.var, expr)


def acc_type(dtype) -> str:
    """The register type column partials are summed in."""
    return "double" if REGISTER_TYPE[dtype] == "double" else "float"


def kernel_params(program: ReductionProgram, dims: int, extra: list[str], k2: bool = False,
                  acc: tuple[int, ...] = ()) -> list[str]:  # fmt: skip
    """Each access's and store's pointer, strides along the `dims` row dims and the reduced
    stride(s); then `extra`, then the scalar inputs. Stores in `acc` are partials buffers."""
    params = []
    for prefix, items in (("a", program.accesses), ("o", program.stores)):
        for i, item in enumerate(items):
            ptr = (f"const {MEMORY_TYPE[item.dtype]}*" if prefix == "a" else
                   f"{acc_type(item.dtype) if i in acc else MEMORY_TYPE[item.dtype]}*")  # fmt: skip
            params.append(f"{ptr} {prefix}{i}")
            params += [f"idx_t {prefix}{i}_s{d}" for d in range(dims)] + [f"idx_t {prefix}{i}_k"]
            if k2:
                params.append(f"idx_t {prefix}{i}_k0")
    params += extra
    params += scalar_params(program)
    return params


def k_offset(name: str, k: str, k2: bool, unit: bool = False) -> str:
    """Offset of reduced element `k` in tensor `name` (Note [Two reduced dims]); `unit`:
    the innermost reduced stride is 1."""
    inner = f"({k})" if unit else f"({k}) * {name}_k"
    if not k2:
        return inner
    inner = f"(({k}) % K1)" if unit else f"(({k}) % K1) * {name}_k"
    return f"(({k}) / K1) * {name}_k0 + {inner}"


def ident(ctype: str) -> str:
    """A C type as part of an identifier."""
    return "".join(ch if ch.isalnum() else "_" for ch in ctype)


def softmax_reductions(program: ReductionProgram) -> tuple | None:
    """(max, sum) when the program's only reductions are softmax's: a float max of x in
    stage 1 and the sum of exp(x - max) in stage 2 (Note [Online column softmax], Note
    [Flushed softmax terms])."""
    reds = program.reductions
    if len(reds) != 2 or [(r.op, r.stage) for r in reds] != [("max", 1), ("sum", 2)]:
        return None
    r1, r2 = reds
    if any(accumulator_type(r) != "float" for r in reds):
        return None
    by_var = {st.var: st for st in program.stmts}
    e = by_var.get(r2.input)
    if e is None or e.op != "exp" or e.compute is not DataType.Float:
        return None
    d = by_var.get(e.operands[0])
    if d is None or d.op != "sub" or d.compute is not DataType.Float or (
            tuple(d.operands) != (r1.input, r1.var)):  # fmt: skip
        return None
    return r1, r2
