"""docs/api.md lists every `fd.ops` name of nvFuser's legacy frontend and of fusion-cache's,
and says of each only what is true: a name marked 'not yet' is absent from `fd.ops`, any
other is present, a 'pointwise kernel' op is one the pointwise lowering knows, a 'reduction
kernel' op one the reduction scheduler knows, a 'reference evaluator' op has an interpreter
rule."""
from __future__ import annotations

import os
import re

from fusion_cache import FusionDefinition
from fusion_cache.frontend.ops.table import OPS
from fusion_cache.ir.interpret.core import RULES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# nvFuser's legacy frontend, python_bindings.cpp at its last version with it: every name
# bound on FusionDefinition.Operators (133)
NVFUSER_OPS = set("""
abs acos acosh asin asinh atan atanh ceil cos cosh exp exp2 expm1 erf erfc erfinv erfcinv
floor frac lgamma log log10 log1p log2 neg logical_not bitwise_not relu rand_like randn_like
reciprocal round rsqrt set segment_set sign sigmoid signbit silu sin sinh sqrt tan tanh trunc
isfinite isinf isnan isneginf isposinf isreal real imag triu stride_order matmul linear add
atan2 div truediv fmod mul nextafter pow remainder sub minimum maximum mod eq ge gt le lt ne
logical_and logical_or bitwise_and bitwise_or bitwise_xor bitwise_left_shift
bitwise_right_shift logical_right_shift gcd add_alpha sub_alpha lerp where clamp threshold
addcmul max min prod sum cast normal uniform full batch_norm broadcast_in_dim broadcast cat
expand index_select index_put_accumulate select scatter gather pad take_along_axis permute
shape size at slice squeeze tensor_sizes reshape iota var var_mean welford sdpfa_bwd sdpfa_fwd
embedding_fwd argsort bmm grouped_mm topk cumsum scaled_mm
""".split())


def table() -> dict[str, str]:
    rows = {}
    with open(os.path.join(ROOT, "docs", "api.md")) as f:
        for line in f:
            m = re.match(r"^\| `(\w+)` \| [^|]+ \| ([^|]+) \|$", line.rstrip("\n"))
            if m:
                assert m.group(1) not in rows, f"docs/api.md lists {m.group(1)} twice"
                rows[m.group(1)] = m.group(2).strip()
    return rows


def ops_names() -> set[str]:
    with FusionDefinition() as fd:
        return {n for n in dir(fd.ops) if not n.startswith("_") and callable(getattr(fd.ops, n))}


def test_nvfusers_list_is_the_133_names():
    assert len(NVFUSER_OPS) == 133


def test_table_lists_every_name_of_nvfuser_and_of_fd_ops():
    rows, ours = table(), ops_names()
    assert not NVFUSER_OPS - rows.keys(), f"nvFuser names missing from docs/api.md: {sorted(NVFUSER_OPS - rows.keys())}"
    assert not ours - rows.keys(), f"fd.ops names missing from docs/api.md: {sorted(ours - rows.keys())}"
    assert not rows.keys() - NVFUSER_OPS - ours, f"docs/api.md lists unknown names: {sorted(rows.keys() - NVFUSER_OPS - ours)}"


def test_table_says_what_exists():
    rows, ours = table(), ops_names()
    for name, how in rows.items():
        if how.startswith("not yet"):
            assert name not in ours, f"{name} is in fd.ops now: docs/api.md still says 'not yet'"
        else:
            assert name in ours, f"docs/api.md says {name} runs ({how}) but fd.ops has no {name}"


def test_claimed_kernels_and_rules_exist():
    from fusion_cache.ir.decompose import COMPOSITES
    from schedulers.pointwise import VIEW_OPS
    from schedulers.reduction import REDUCTIONS

    pointwise = set(OPS) | VIEW_OPS | {"cast", "full", "reshape", "iota"} | COMPOSITES
    for name, how in table().items():
        if how.startswith("pointwise kernel"):
            assert name in pointwise, f"{name}: the pointwise lowering does not know it"
        if how.startswith("reduction kernel"):
            assert name in REDUCTIONS or name == "batch_norm", f"{name}: not a reduction"
        if how.startswith("reference evaluator"):
            assert name in RULES, f"{name}: no interpreter rule"
        if how.startswith("ATen segment"):
            from schedulers.aten import ATEN_OPS

            assert name in ATEN_OPS, f"{name}: the ATen scheduler does not run it"
