"""Can a kernel with compiled cluster dims be launched cooperatively here, so that a
grid-wide barrier inside it is safe? (The column-sum finish of Note [One wave of
partials] could then run inside the row kernel instead of as a second launch.)

    python -m benchmarks.cooperative_probe > benchmarks/results/cooperative-probe-<device>.txt

Launches a kernel of 2-block clusters whose blocks all meet at a spin barrier on a global
counter: with the cooperative attribute at the driver's count of resident clusters (every
block must get past the barrier), then with one cluster more (the driver should refuse
rather than let the barrier hang), then without the attribute and without the barrier.
"""

from __future__ import annotations

import ctypes
import sys

import torch

BARRIER_KERNEL = r"""
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(256) probe(
    unsigned* counter, int* passed, unsigned blocks, int barrier) {
  if (barrier) {  // every block of the grid arrives before any goes on
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      const unsigned ticket = atomicAdd(counter, 1u);
      const unsigned target = (ticket / blocks + 1) * blocks;
      unsigned seen;
      do {
        asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(seen) : "l"(counter));
      } while (seen < target);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) passed[blockIdx.x] += 1;
}
"""


def main() -> int:
    from cuda.bindings import driver

    from codegen.nvrtc import compile_cubin

    torch.zeros(1, device="cuda")  # the primary context
    err, module = driver.cuModuleLoadData(compile_cubin(BARRIER_KERNEL, 90, name="probe"))
    assert err == driver.CUresult.CUDA_SUCCESS, err
    err, function = driver.cuModuleGetFunction(module, b"probe")
    assert err == driver.CUresult.CUDA_SUCCESS, err
    stream = driver.CUstream(torch.cuda.current_stream().cuda_stream)
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")

    def config(grid: int, cooperative: bool) -> driver.CUlaunchConfig:
        c = driver.CUlaunchConfig()
        c.gridDimX, c.gridDimY, c.gridDimZ = grid, 1, 1
        c.blockDimX, c.blockDimY, c.blockDimZ = 256, 1, 1
        c.sharedMemBytes, c.hStream = 0, stream
        if cooperative:
            a = driver.CUlaunchAttribute()
            a.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
            a.value.cooperative = 1
            c.attrs, c.numAttrs = [a], 1
        else:
            c.numAttrs = 0
        return c

    err, clusters = driver.cuOccupancyMaxActiveClusters(function, config(2, False))
    print(f"{torch.cuda.get_device_name()}: {clusters} clusters of 2 resident ({err.name})")
    grid = 2 * clusters
    for blocks, cooperative in ((grid, True), (grid + 2, True), (grid, False)):
        passed = torch.zeros(blocks, dtype=torch.int32, device="cuda")
        args = ((counter.data_ptr(), passed.data_ptr(), blocks, int(cooperative)),
                (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int))  # fmt: skip
        (err,) = driver.cuLaunchKernelEx(config(blocks, cooperative), function, args, 0)
        torch.cuda.synchronize()
        print(f"grid {blocks} blocks, cooperative={cooperative}, barrier={cooperative}: "
              f"{err.name}; {int(passed.sum())} of {blocks} blocks ran to the end")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
