"""Named overrides of the schedulers' heuristic choices.

Note [Tuning knobs]: every number a heuristic picks that a GPU run might want to question
(threads a row, values a thread keeps, cache hints, ...) is read through `knob(name,
default)`. In normal use nothing is overridden and the default is the heuristic's choice;
`benchmarks/sweep.py` overrides knobs to time the alternatives on a GPU, which is how the
defaults were chosen. A knob changes the generated source or the launch, so kernel keys
follow it; plans cached before a change are the caller's to drop.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from fusion_cache.frontend.options import env_flag

_local = threading.local()

# name -> what it sets; `overriding` refuses other names, so a typo fails loudly
KNOBS: dict[str, str] = {
    "pointwise.block": "threads a block of the pointwise kernel",
    "pointwise.unroll": "vectors a pointwise thread loads before computing",
    "pointwise.pair": "where windows split the innermost dim in halves, a thread takes a vector "
                      "in each half, reading rotate-half partners once (Note [Paired halves])",
    "pointwise.blocks_per_sm": "most blocks of the pointwise kernel an SM, its threads looping "
                               "over the rest (0: a thread a vector group)",
    "pointwise.rows": "rows of the outermost dim a pointwise thread takes, loading inputs dead "
                      "along it once for all (Note [Broadcast rows]; 1: none)",
    "pointwise.vec": "elements a pointwise thread takes along the innermost dim (0: 16 bytes "
                     "of the widest dtype read or written along it)",
    "inner.threads": "threads a block of the inner reduction kernel",
    "inner.tx": "threads a row of the inner reduction kernel",
    "inner.values": "values a thread keeps of one row (registers)",
    "inner.min_blocks": "blocks an SM must hold (__launch_bounds__ minimum; 0 = unset)",
    "inner.waves": "blocks a launch gets, per SM (0 = one block per row group)",
    "inner.cluster": "blocks (a thread-block cluster) sharing one row",
    "inner.pipeline": "copy the next row group to shared memory while computing (Note [Row pipeline])",
    "inner.balance": "blocks of the row kernel looping over row groups: as many as give each "
                     "the same number of them (Note [Balanced row loops]; False: the capped grid)",
    "inner.groups": "row groups (blocks, clusters) of a kernel looping over them (partials, pipelines)",
    "inner.merge": "reduce a stage's row reductions of one type together (Note [Merged row reductions])",
    "inner.reread": "blocks sharing a row too long for a cluster's registers (0: one block)",
    "inner.smem_rows": "column partials beside a row too long for registers: keep the row in "
                       "shared memory, pipelined (Note [Rows in shared memory])",
    "inner.smem_some": "where a row's inputs do not all fit shared memory twice, keep the first "
                       "there and read the others in each pass (Note [Rows in shared memory])",
    "inner.cache": "keep the row in registers between passes (False: read it again)",
    "inner.exchange_async": "cluster blocks swap row partials through mbarriers, not a "
                            "cluster barrier (Note [Cluster exchange])",
    "inner.defer": "a row in shared memory ends after the next row's first pass, its cluster "
                   "exchange waited for there (Note [Deferred row end])",
    "inner.alternate": "row reductions alternate between two shared-memory buffers, one block "
                       "barrier each (Note [Alternating row buffers])",
    "inner.hoist": "load inputs every row shares once, into registers (Note [Weights loaded once])",
    "inner.hoist_smem": "load those once into shared memory instead (Note [Weights loaded once])",
    "inner.rows": "row groups a thread of a cached short row loads ahead together (Note [Rows a "
                  "thread]; 1: one)",
    "inner.unroll": "vectors a thread loads ahead in a pass that reads the row from memory",
    "inner.rng_lanes": "random numbers drawn by lane where every vector starts a Philox group "
                       "(Note [Philox lanes]; False: the group compared each element)",
    "rows.chain": "an embedding's gradient as row chains: tokens pushed on their row's list, "
                  "each output row adding its list's values (Note [Row chains]; the default, "
                  "Note [Slab walk]; False: claims, atomic adds of shared rows and a rows "
                  "kernel, Note [Row sums])",
    "rows.units": "(row, column vector) units a thread of the row chains' walk takes, their "
                  "loads issued together, where rows.slab_walk is 0 (Note [Row chains])",
    "rows.bound": "most tokens on a row's list in the row chains (4 by default); a hot row's "
                  "others add to float sums with atomics (Note [Row chains]; 0: unbounded)",
    "rows.slab_walk": "units a thread of the row chains' slab walk takes: a block loads its "
                      "rows' head words once, stores the fill to the rows no token names, then "
                      "adds the lists (Note [Slab walk]; 8 by default; 0: the walk of "
                      "rows.units)",
    "rows.slab_blocks": "blocks an SM the slab walk's registers must allow (Note [Slab walk]; "
                        "0: as the compiler likes)",
    "rows.warp_adds": "the bounded row chains' link adds a warp's tokens past the bound "
                      "together, runs on one slot summed in registers (Note [Warp adds]; "
                      "True by default)",
    "rows.link_ahead": "tokens past the bound whose values a warp of the bounded link loads "
                       "before adding any (Note [Warp adds]; 4 by default)",
    "rows.link_block": "threads a block of the bounded link (Note [Warp adds]; 256 by default): "
                       "smaller blocks spread a padded batch's hot warps over more SMs",
    "rows.link_match": "the bounded link's lanes naming one row take their places with one "
                       "atomic, one of them waiting for a hot row's slot (Note [Matched places])",
    "rows.split": "the row chains' rows kernel as named blocks (a warp a row the link "
                  "listed) and fill blocks that never wait on a gather (Note [Split walk]; "
                  "True by default; False: the slab walk)",
    "rows.walk_adds": "with rows.split, the link lists the tokens past their row's bound and "
                      "the walk's first blocks add them while the fill is stored (Note [Walk "
                      "adds]; True by default)",
    "rows.sorted": "the slab walk adds a named row's list (bounded at 32 or fewer) in token "
                   "order, not list order (Note [Sorted lists])",
    "rows.slab_persist": "blocks an SM of a slab walk whose blocks take the slabs in turn "
                         "(Note [Slab walk]; 0: a block a slab)",
    "rows.fill_first": "the slab walk stores the fill to all its rows before waiting for the "
                       "link, the named rows again after (Note [Fill first])",
    "rows.kept": "the slab walk's words live between runs, set back by the walk once read, "
                 "so no fill kernel runs (Note [Kept words]; True by default)",
    "rows.slab": "an embedding's gradient as row slabs: a block a slab of output rows reads "
                 "the index and writes each row once, sums in index order, hot rows split over "
                 "index segments (Note [Row slabs]; False: Note [Row sums])",
    "rows.slab_rows": "output rows a block of the row slabs' rows kernel writes",
    "rows.slab_most": "most tokens of a row the row slabs' rows kernel sums; rows named more "
                      "often are hot (Note [Row slabs])",
    "rows.owned": "an embedding's gradient as one kernel: a block owns R output rows, reads the "
                  "whole index, writes each row once in token order; a run of 32 tokens on one "
                  "row makes it hot, summed in slices by other blocks (Note [Owned rows]; off: "
                  "slower on the H100)",
    "rows.owned_threads": "threads a block of the owned rows (Note [Owned rows]; 512)",
    "rows.owned_blocks": "blocks an SM the owned rows' grid is one wave of (2)",
    "rows.owned_lv": "column vectors a lane of an owned named row adds a pass (3)",
    "rows.owned_ahead": "tokens of an owned named row whose values load before any is added (1)",
    "rows.owned_hot_ahead": "tokens' slices a lane of an owned hot slice loads before adding (4)",
    "rows.owned_slice_rows": "rows a hot slice of the owned rows counts for where a block's rows "
                             "are dealt: blocks summing slices own fewer rows (0: none)",
    "rows.owned_early": "rows a warp of the owned rows stores the fill to before the lists are "
                        "built (0)",
    "rows.early": "the row-sums kernels let the next, launched dependent, be placed at once "
                  "(griddepcontrol.launch_dependents at their start; by default with the row "
                  "chains only)",
    "launch.dependent": "a finish kernel starts while the kernel before it runs "
                        "(Note [Dependent launch])",
    "load.hint": "cache hint of streamed loads: 0 ld.nc, 1 L1::no_allocate, 2 L2::256B, 3 both, "
                 "5 plain ld.global (Note [Plain loads])",
    "load.weights": "cache hint of inputs every row reads again: 4 L2::evict_last, 0 plain "
                    "(Note [Weights kept in L2])",
    "store.hint": "cache hint of streamed stores: 0 plain, 1 evict-first (.cs)",
    "finish.fused": "column sums added up in the row kernel after a grid barrier (Note [Finish in "
                    "the row kernel]; False: a second kernel)",
    "finish.strips": "column-sum finish threads take four columns and every block's partials "
                     "of them (Note [Column strips])",
    "finish.rows": "threads sharing a column's partials in the column-sum finish kernel",
    "outer.tx": "column threads of an outer reduction block",
    "outer.ty": "row threads of an outer reduction block",
    "outer.unroll": "rows a thread of an outer reduction loads before accumulating",
    "outer.blocks_per_sm": "blocks the split of an outer reduction aims at, per SM",
    "outer.finish_tx": "columns a block of an outer reduction's finish kernel folds",
    "outer.finish_ty": "thread rows sharing a column's partials in an outer reduction's finish",
    "outer.cluster": "split blocks combine in one cluster (Note [Cluster columns]; 0: a second kernel)",
    "split.threads": "threads a block of a few long rows split over the GPU (Note [Split rows])",
    "split.unroll": "vectors a thread of a split row loads before accumulating",
    "split.blocks_per_sm": "blocks an SM the slices of split rows aim at",
    "split.max_rows": "rows under which long pure reductions are split over the GPU",
    "colnorm.values": "registers of values a thread of a column norm keeps (16-bit values two "
                      "to a register; Note [Column norms])",
    "colnorm.vec": "columns a thread of a column norm takes, one vector load a row",
    "colnorm.reuse_exp": "softmax's output takes exp(x - M) as the sum pass's exp(x - m_b), kept "
                         "in registers, times exp(m_b - M) (Note [Online column softmax])",
    "colnorm.tx": "column threads of a column norm block (VEC columns each)",
    "colnorm.ty": "thread rows of a column norm block",
    "colnorm.cluster": "blocks of a cluster sharing a column norm's reduced dim",
    "colnorm.online": "softmax's max and sum through one cluster exchange (Note [Online column "
                      "softmax]; False: one exchange a stage)",
    "colnorm.persistent": "clusters of a column norm stay resident and load their next tile "
                          "while ending the current one (Note [Column tiles in flight]; "
                          "default: rows of 32-bit values)",
    "colnorm.push": "a column norm's blocks push their partials to every peer through mbarriers "
                    "(as persistent ones do), not a cluster barrier and remote loads (default: "
                    "16-bit rows)",
    "colnorm.blocks_per_sm": "blocks an SM a persistent column norm's wave is planned for",
    "colnorm.smem": "a column norm's rows copied to shared memory by cp.async instead of kept in "
                    "registers (Note [Column rows in smem]; default: 16-bit rows)",
    "colnorm.min_blocks": "blocks an SM a column norm asks for (__launch_bounds__ minimum; 0 = unset)",
    "colnorm.deep": "a softmax over a reduced dim long enough for clusters of 8 takes 32-column "
                    "tiles, 16 rows a thread in shared memory, in four groups (Note [Whole "
                    "column tiles]; default: 16-bit rows; False: the clusters of Note [Column "
                    "norms])",
    "colnorm.chunks": "groups a column norm block holding the whole reduced dim in shared memory "
                      "copies its rows in, softmax's max and sum folded as each lands (Note "
                      "[Whole column tiles]; 0: one group, three passes)",
    "colnorm.refill": "column norm blocks holding the whole reduced dim in shared memory loop "
                      "over tiles, each slot refilled with the next tile's row once its output "
                      "is written (Note [Whole column tiles])",
    "colnorm.lean": "column softmax in fewer instructions: packed bf16 maxima, flushed sum "
                    "terms, the division folded into the output's exp2 (Note [Lean column "
                    "softmax]; default: 16-bit rows and deep tiles)",
    "colnorm.deep_rows": "rows a thread of the deep column tiles holds at most, which sets their "
                         "cluster (Note [Whole column tiles]; default 16)",
    "colnorm.fold_bytes": "shared memory a column norm's row fold may take (Note [Row fold]; "
                          "default: 16 KB, halved until the blocks asked for fit an SM)",
    "colnorm.end_sync": "column norm clusters pushing their partials meet at a cluster barrier "
                        "before exiting (Note [Column exchange]; default: only those reading "
                        "their peers' partials)",
    "transpose.tile_a": "elements of a transpose tile along the outputs' innermost dim (Note "
                        "[Transpose tiles])",
    "transpose.tile_b": "elements of a transpose tile along the staged inputs' innermost dim",
    "transpose.threads": "threads a block of the transpose kernel",
    "transpose.stages": "tiles of staged inputs a transpose block keeps in shared memory, the "
                        "next ones in flight (cp.async)",
    "transpose.vec": "most elements a transpose thread moves as one access (V; blocks of V x V)",
    "transpose.tiles_each": "tiles a transpose block takes (1, the default: a block a tile; "
                            "0: one resident wave of blocks looping over them; -1: as few "
                            "blocks of the wave as take the same rounds)",
    "transpose.blocks_per_sm": "most transpose blocks an SM (the wave: SMs times this)",
    "transpose.min_side": "fewest elements along either tile dim for a transpose to be tiled",
}


def _current() -> Mapping[str, Any]:
    return getattr(_local, "values", {})


def overridden() -> dict[str, Any]:
    """The knobs overridden for this thread, by name."""
    return dict(_current())


def knob(name: str, default: Any) -> Any:
    """The override of `name` if one is set, else `default` (the heuristic's choice)."""
    return _current().get(name, default)


@contextmanager
def overriding(values: Mapping[str, Any]) -> Iterator[None]:
    """Override knobs for the calls inside the block (this thread only)."""
    unknown = sorted(set(values) - set(KNOBS))
    if unknown:
        raise KeyError(f"unknown tuning knob(s) {unknown}; known: {sorted(KNOBS)}")
    before = _current()
    _local.values = {**before, **values}
    try:
        yield
    finally:
        _local.values = before


# Note [Unmeasured switches]: changes planned and tested on the CPU whose GPU time has not been
# measured yet stay off until a GPU run decides; FUSION_CACHE_<NAME>=1 turns one on. Each
# changes plans, so the segmenter's version (Note [Stored segmentations]) names the ones on.
# H100, 2026-11-27 (benchmarks.models, contender fusion_cache_switched, all four on, same run):
# GPT-2 14.22 ms a step against 8.84 off, Llama-style 9.00 against 7.79, ResNet-18 10.19 against
# 9.80, with fewer launches (GPT-2 156 against 183, Llama 77 against 106); losses as eager's (GPU
# test). Which switch costs the time is not known yet: time each alone before turning one on.
# COUNTERS_REGION and LONE_CONVOLUTIONS (added later), H100 07:59 UTC, ResNet-18 under
# --deterministic (benchmarks/results/models-resnet18-deterministic-*): 16.21 ms a step with
# both against 17.01 without, within the noise (eager 16.87, eager run again 15.95); losses
# bit-identical, ops left to eager 24 -> 0, one launch more (the counters' kernel, for 20
# eager add_). Not yet timed under torch's default settings.
# Interleaved A/B (benchmarks.ab_steps, Note [Interleaved A/B]), H100 80GB HBM3, 10:15 UTC, torch's
# defaults, ResNet-18, 8 rounds of 10 steps in one process: median step ms eager 7.95, inductor
# 8.96, neither switch 8.19, COUNTERS_REGION 7.70 (faster than neither in 8 of 8 rounds; an eager
# add_ of a 0-d counter cost about 11 us of host under cProfile), LONE_CONVOLUTIONS 7.99 (4 of 8
# rounds), both 7.70. So COUNTERS_REGION is on by default (ON_BY_DEFAULT; =0 turns it off).
# Second run (10:44 UTC, another H100 host, noisier: eager's round medians 7.7-10.4 ms), 10
# rounds: ResNet-18 eager 9.14, COUNTERS_REGION off 8.91, on 8.73 (faster in 7 of 10 rounds,
# min 6.98 against 7.60), +LONE_CONVOLUTIONS 8.84, +PAIRED_PIECES and LONE 8.66 (19 regions),
# +PACKED_OUTPUTS 8.79, all three 8.82 (min 6.33); Llama-style eager 15.55, default 7.87,
# PAIRED_PIECES 7.56 (6 regions), PACKED_OUTPUTS 7.37, both 8.24, losses the default's to the
# bit. Paired round by round with the default (ab_steps --baseline): COUNTERS_REGION on 0.963
# of off in the first run (8 of 8 rounds faster), 0.970 in the second (7 of 10); in the second,
# LONE_CONVOLUTIONS 0.997 (5 of 10), PAIRED_PIECES 1.003 (5), PACKED_OUTPUTS 1.012 (4), all three
# 0.993 (5); Llama-style PAIRED_PIECES 0.992 (5), PACKED_OUTPUTS 0.993 (5), both 1.045 (4). So
# those three stay off: each moves a ResNet-18 step by about 1% at most, inside the noise.
# Issue 30, H100 80GB HBM3, 13:58 UTC (the lead's run on merged main, benchmarks.ab_steps, 4
# rounds of 8 steps): VIEWS_TO_READERS + CASTS_BEFORE_VIEWS + SAVED_VIEWS_REDONE +
# PEER_REDUCTIONS together against none: Llama-style 8.73 against 9.02 ms (0.950 by paired
# rounds, 3 of 4 faster; inductor 7.61), GPT-2 11.87 against 12.23 (0.973, 2 of 4; inductor
# 12.63), ResNet-18 8.79 against 8.56 (1.039, 2 of 4: noise); losses the default's. Each alone
# not timed; still off.
# Those A/Bs shared plans in memory between variants (keyed by definition and inputs, not by
# switches): a region defined alike under both took the default's segmentation in the switched
# variant (benchmarks/ab_steps.py, CPU: tiny Llama-style 43 launches a step against 38 alone),
# so they measured the four switches only partly. Rerun with the plans dropped between
# variants, H100 80GB HBM3, 16:00 UTC, 4 rounds of 8 steps (results/ab-steps-issue30-final-*):
# GPT-2 12.17 against 13.10 ms median (0.927 by paired rounds, 4 of 4 faster; 153 launches a step
# against 179; inductor 11.99, eager 14.09; losses the default's to the digit), ResNet-18 9.69
# against 9.66 (1.030, 2 of 4: its 43 launches and 38 regions are the same either way);
# Llama-style not reached in that call (its time limit), so its figure is the 13:58 one above
# (0.950, 3 of 4, on partly shared plans; planned for h100 on the CPU at the benchmark's
# sizes: 68 launches a step against 105). Faster on both transformer models in every run,
# ResNet-18 unchanged in its work: the four are on by default (ON_BY_DEFAULT; =0 turns one off).
# MIN_CUT and LEADING_ROWS, first GPU A/B (H100 80GB HBM3, 17:48 UTC, benchmarks.ab_steps, 4 rounds of 8
# steps, each against the default, paired by round; results/ab-steps-switches-mincut-rows-*): MIN_CUT
# Llama-style 1.037 (1 of 4 rounds faster), GPT-2 1.007 (1 of 4), ResNet-18 0.975 (4 of 4);
# LEADING_ROWS 1.069 (1 of 4), 1.002 (2 of 4), 0.968 (4 of 4). The transformer steps are host-bound
# and the min-cut's smaller saved set (no f32 log-softmax written and read back) does not show in
# them; neither wins on all three models, so both stay off.
SWITCHES: dict[str, str] = {
    "VIEWS_TO_READERS": "a group reading views of a tensor takes the view ops along (Note "
                        "[Views go with their readers], schedulers/segmenter.py)",
    "LEADING_ROWS": "inner-outer column sums over every dim but the last of a loop of any rank "
                    "(Note [Leading dims as rows], schedulers/inner_outer.py)",
    "CASTS_BEFORE_VIEWS": "the torch.compile backend moves casts ahead of the views they read "
                          "(Note [Casts before views], fusion_cache/frontends/fx_casts.py)",
    "COUNTERS_REGION": "the torch.compile backend updates a graph's counters (batch norm's "
                       "num_batches_tracked) in one region of one kernel (Note [Counter "
                       "updates], fusion_cache/frontends/fx_counters.py)",
    "LONE_CONVOLUTIONS": "the torch.compile backend puts a convolution that would be a region "
                         "of one op into a neighbour's region (Note [Lone convolutions], "
                         "fusion_cache/frontends/dynamo_backend.py)",
    "PAIRED_PIECES": "the torch.compile backend makes two neighbouring pieces of a cut "
                     "partition one region (Note [Paired pieces], "
                     "fusion_cache/frontends/dynamo_backend.py)",
    "PACKED_OUTPUTS": "a launch sequence carves a kernel step's small outputs of one dtype "
                      "from one allocation (Note [Packed small outputs], "
                      "fusion_cache/runtime/sequence.py)",
    "OLD_HOST_PATH": "the host path as before 2026-11-27's cuts, for an A/B against it: "
                     "detaches and repeated views stay eager (Note [Views as aliases], "
                     "fusion_cache/frontends/eager_views.py), launch sequences run as before "
                     "(Note [Straight runs], fusion_cache/runtime/sequence.py), GEMMs "
                     "through torch.matmul (Note [GEMM entry], fusion_cache/runtime/"
                     "aten_calls.py)",
    "PEER_REDUCTIONS": "the segmenter tries to merge two groups that each own a reduction of "
                       "the same extents over the same dims (Note [Peer reductions], "
                       "schedulers/segmenter.py)",
    "SAVED_VIEWS_REDONE": "the torch.compile backend's default partitioner saves the base of a "
                          "view the backward reads and the backward redoes the view (Note "
                          "[Saved views redone], fusion_cache/frontends/recompute.py)",
    "WHOLE_REGIONS": "the torch.compile backend cuts partitions after convolutions alone, "
                     "not after attention ops (Note [Region cuts], fusion_cache/frontends/"
                     "dynamo_backend.py): a transformer's graph is one region; steps within "
                     "the noise, a longer segmentation search",
    "MIN_CUT": "the torch.compile backend partitions forward and backward with AOTAutograd's "
               "min-cut (Note [Recompute in the backward], fusion_cache/frontends/recompute.py)",
    "SPLIT_LOOPS": "the pointwise scheduler splits its loop where a reshape merges dims whose "
                   "strides do not nest (Note [Split loops], schedulers/loop_split.py) and "
                   "writes outputs of other shapes as its loop runs (Note [Outputs of other "
                   "shapes], schedulers/pointwise.py)",
    "SAME_VIEWS_ONCE": "the torch.compile backend's default partitioner takes a view op with the "
                       "same source and arguments as an earlier one as that one (Note [Same "
                       "views once], fusion_cache/frontends/recompute.py)",
}


# the switches a GPU run decided for: on unless FUSION_CACHE_<NAME>=0 (each with its figures
# in the Note its description names). SPLIT_LOOPS and SAME_VIEWS_ONCE (2026-11-28, Note [Split
# loops]): 8 fewer launches a Llama-style step, its step time within the noise of the A/B; on
# because they only remove work (a kernel and the tensor it handed on)
ON_BY_DEFAULT: frozenset[str] = frozenset({"COUNTERS_REGION", "VIEWS_TO_READERS",
                                           "CASTS_BEFORE_VIEWS", "SAVED_VIEWS_REDONE",
                                           "PEER_REDUCTIONS", "SPLIT_LOOPS",
                                           "SAME_VIEWS_ONCE"})


def switched_on(name: str) -> bool:
    """Whether switch `name` is on (Note [Unmeasured switches]): FUSION_CACHE_<name> set
    (env_flag), else its default (ON_BY_DEFAULT)."""
    if name not in SWITCHES:
        raise KeyError(f"unknown switch {name}; known: {sorted(SWITCHES)}")
    return env_flag(f"FUSION_CACHE_{name}", name in ON_BY_DEFAULT)


def switches_on() -> tuple[str, ...]:
    return tuple(name for name in SWITCHES if switched_on(name))
