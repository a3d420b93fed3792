"""Clusters (or blocks) of each benchmark kernel the GPU holds at once, as the driver counts
them (Note [One wave of partials]); checks the profile's GPC layout.

    python -m benchmarks.occupancy [CASE ...]
"""

from __future__ import annotations

import sys

import torch

from benchmarks.cases import CASES
from fusion_cache.runtime.executor import executor_for

DEFAULT = ["layer_norm_bwd_bf16_1024x65536", "layer_norm_bwd_f32_256x262144",
           "layer_norm_bwd_f32_1024x65536", "layer_norm_bwd_bf16_4096x16384",
           "softmax_bf16_256x262144", "batch_norm_f32_32x256x56x56", "var_mean_f32_1024x65536",
           "sum_outer_bf16_4096x16384"]  # fmt: skip


def main(names: list[str]) -> None:
    by_name = {c.name: c for c in CASES}
    print(f"# {torch.cuda.get_device_name()}: resident clusters of each case's kernels")
    for name in names or DEFAULT:
        case = by_name[name]
        fd = case.build()
        fd.execute(case.inputs("cuda"))
        plan = executor_for(fd).last_plan
        for kernel, launch in zip(getattr(plan, "kernels", ()), getattr(plan, "spec", plan).kernels):
            print(f"{name:36s} {launch.name:20s} grid {launch.grid} block {launch.block} "
                  f"cluster {kernel.cluster_dims} regs {kernel.num_regs}: "
                  f"{kernel.max_resident(launch.block, launch.shared_mem)} resident")


if __name__ == "__main__":
    main(sys.argv[1:])
