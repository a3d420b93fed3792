"""Render reduction programs (Note [Reduction loop space] in schedulers/reduction/lowering.py)
as CUDA kernels.

Inner (row) kernel: TX threads per row, TY rows per block; one pass over the row per
reduction stage and a last pass for element-level outputs, reading loads from registers when
the row fits (ITERS > 0), from memory (L2 in practice) otherwise.
Outer kernels: threads own VEC consecutive columns, TY threads and SPLIT blocks share the
reduced dim; with SPLIT > 1 a second kernel combines the partial results in a fixed order.

One module a decision: `variants` (the launch choices a scheduler hands over), `common` (op
functors, accumulator types, parameters, row-level statements), `row_kernel` (the row
kernel's passes), `row_loads` (how a row's data arrives: pipeline, registers, weights),
`cluster_exchange` (row partials across a cluster, the deferred row end), `column_finish`
(column partials and their finish), `outer_kernel` (dim-0 and middle-dim reductions and
their finish), `split_kernel` (slices of a few long rows), `column_norm` (normalizations
along a strided dim).
"""
