"""A lowered program's statements as torch ops, for the CPU tests that replay a plan: each
test supplies how an access is loaded (through the plan's strides) and how a reduction
combines, and gets every statement's value."""
import torch

from fusion_cache.frontend.dtypes import to_torch
from fusion_cache.frontend.ops.table import OPS


def welford_value(op, attrs, mean, m2, count):
    """A value read off a Welford triple (mean, m2, count)."""
    if op == "welford_var":
        return m2 / (count - attrs.get("correction", 0.0))
    if op == "welford_count":
        return torch.full_like(mean, count)
    return mean if op == "welford_mean" else m2


def eval_stmts(program, load, values=(), reduce=None, env=None, stmts=None):
    """Values of `stmts` (the program's, by default) into `env`: `load(k)` gives access k,
    `reduce(stmt, x)` a reduction of x (a Welford triple for op 'welford'), `values` the
    execute inputs that scalar parameters read."""
    env = {} if env is None else env
    for st in program.stmts if stmts is None else stmts:
        attrs = dict(st.attrs)
        if st.op == "load":
            env[st.var] = load(st.operands[0])
        elif st.op == "const":
            env[st.var] = attrs["value"]
        elif st.op == "param":
            env[st.var] = values[attrs["pos"]]
        elif st.op == "cast":
            env[st.var] = torch.as_tensor(env[st.operands[0]]).to(to_torch(st.dtype))
        elif st.op == "reduce":
            env[st.var] = reduce(st, env[st.operands[0]])
        elif st.op.startswith("welford_"):
            env[st.var] = welford_value(st.op, attrs, *env[st.operands[0]]).to(to_torch(st.dtype))
        else:
            ct = to_torch(st.compute)
            args = [env[o].to(ct) if isinstance(env[o], torch.Tensor) else env[o]
                    for o in st.operands]  # fmt: skip
            env[st.var] = OPS[st.op].torch_fn(*args, dtype=st.compute).to(to_torch(st.dtype))
    return env
