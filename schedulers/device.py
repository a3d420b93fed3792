"""Device profiles: what the heuristics know about a GPU.

A profile is read from the current GPU, or taken by name (`h100`, `a100`, ...) when compiling
ahead of time on a machine without one. Named profiles hold datasheet numbers; on matching
hardware current_profile() reads the same values back (mem_bandwidth_gbs may differ slightly,
and is only used to report effective bandwidth).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


@dataclass(frozen=True, kw_only=True)
class DeviceProfile:
    name: str
    arch: int  # compute capability as one int: 90 for sm_90
    sm_count: int
    warp_size: int = 32
    max_threads_per_block: int
    max_threads_per_sm: int
    regs_per_block: int
    regs_per_sm: int
    smem_per_block: int  # without opting in
    smem_per_block_optin: int  # with CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    smem_per_sm: int
    l2_bytes: int
    mem_bandwidth_gbs: float  # nominal DRAM bandwidth, for effective-bandwidth reports
    supports_clusters: bool
    # blocks a thread-block cluster may have: 16 (non-portable) where measured to launch
    max_cluster: int = 8
    max_blocks_per_sm: int = 32
    smem_reserved_per_block: int = 1 * KiB  # the driver keeps this much per resident block
    mem_bytes: int = 0  # nominal DRAM size; 0 when unknown
    # SMs of each GPC, where known: a cluster runs inside one GPC (Note [One wave of partials])
    gpc_sms: tuple[int, ...] = ()
    # while one fusion is planned again for the GPU it runs on: the clusters of its first
    # kernel the driver says run at once (Note [One wave of partials]); 0: estimate them
    measured_wave: int = 0
    # Note [Finish in the row kernel]: False where a cooperative launch of it cannot hold
    # every block at once here (the runtime plans again with the second kernel)
    fused_finish: bool = True

    def resident_clusters(self, cluster: int, blocks_per_sm: int) -> int:
        """Clusters of `cluster` blocks the GPU runs at once, `blocks_per_sm` blocks an SM:
        a GPC holds those its SMs fit, one block of a cluster an SM (the driver's counts on
        the H100); without the GPCs, the SMs' blocks shared out."""
        if not self.gpc_sms:
            return max(1, self.sm_count * blocks_per_sm // cluster)
        return max(1, sum(n * blocks_per_sm // cluster for n in self.gpc_sms if n >= cluster))

    @property
    def sm_arch(self) -> str:
        return f"sm_{self.arch}"

    @property
    def compute_capability(self) -> tuple[int, int]:
        return divmod(self.arch, 10)


_HOPPER_SXM = dict(
    arch=90, sm_count=132, max_threads_per_block=1024, max_threads_per_sm=2048,
    regs_per_block=65536, regs_per_sm=65536, smem_per_block=48 * KiB,
    smem_per_block_optin=227 * KiB, smem_per_sm=228 * KiB, l2_bytes=50 * MiB,
    supports_clusters=True, max_blocks_per_sm=32,
)

KNOWN_PROFILES: dict[str, DeviceProfile] = {
    p.name: p
    for p in (
        # A100 SXM4 80GB (the 40GB part has the same SMs and 1555 GB/s).
        DeviceProfile(
            name="a100", arch=80, sm_count=108, max_threads_per_block=1024,
            max_threads_per_sm=2048, regs_per_block=65536, regs_per_sm=65536,
            smem_per_block=48 * KiB, smem_per_block_optin=163 * KiB, smem_per_sm=164 * KiB,
            l2_bytes=40 * MiB, mem_bandwidth_gbs=2039.0, supports_clusters=False,
            max_blocks_per_sm=32, mem_bytes=80 * GiB,
        ),
        # H100 SXM5 80GB HBM3, the lent GPU (mem_bytes as its driver reports it); clusters
        # of 16 ran there (benchmarks/results/sweep-long_bwd.json). Its GPCs: seven of 17
        # SMs and one of 13 fit the driver's resident cluster counts for clusters of 4, 8
        # and 16 at one to four blocks an SM (benchmarks/results/occupancy-h100.txt); other
        # chips differ, and the runtime asks the driver
        DeviceProfile(name="h100", mem_bandwidth_gbs=3352.0, mem_bytes=85_017_493_504,
                      **{**_HOPPER_SXM, "max_cluster": 16, "gpc_sms": (17,) * 7 + (13,)}),
        DeviceProfile(
            name="h100-pcie", mem_bandwidth_gbs=2039.0, mem_bytes=80 * GiB,
            **{**_HOPPER_SXM, "sm_count": 114},
        ),
        # H200 SXM 141GB HBM3e: the H100's SMs with more, faster memory; its driver reports
        # a 60 MiB L2 (seen on the lent H200s).
        DeviceProfile(name="h200", mem_bandwidth_gbs=4800.0, mem_bytes=150_109_880_320,
                      **{**_HOPPER_SXM, "l2_bytes": 60 * MiB, "max_cluster": 16}),
        DeviceProfile(
            name="l4", arch=89, sm_count=58, max_threads_per_block=1024,
            max_threads_per_sm=1536, regs_per_block=65536, regs_per_sm=65536,
            smem_per_block=48 * KiB, smem_per_block_optin=99 * KiB, smem_per_sm=100 * KiB,
            l2_bytes=48 * MiB, mem_bandwidth_gbs=300.0, supports_clusters=False,
            max_blocks_per_sm=24, mem_bytes=24 * GiB,
        ),
        DeviceProfile(
            name="a10", arch=86, sm_count=72, max_threads_per_block=1024,
            max_threads_per_sm=1536, regs_per_block=65536, regs_per_sm=65536,
            smem_per_block=48 * KiB, smem_per_block_optin=99 * KiB, smem_per_sm=100 * KiB,
            l2_bytes=6 * MiB, mem_bandwidth_gbs=600.0, supports_clusters=False,
            max_blocks_per_sm=16, mem_bytes=24 * GiB,
        ),
    )
}


def profile_by_name(name: str) -> DeviceProfile:
    """A named profile ('h100', 'A100', ...); ValueError listing the known names otherwise."""
    key = name.strip().lower() if isinstance(name, str) else None
    if key not in KNOWN_PROFILES:
        raise ValueError(
            f"unknown device profile {name!r}; known: {', '.join(sorted(KNOWN_PROFILES))}"
        )
    return KNOWN_PROFILES[key]


def _driver_call(result: tuple, what: str):
    from cuda.bindings import driver

    err, *values = result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {getattr(err, 'name', err)}")
    return values[0] if len(values) == 1 else values


def _current_device_index() -> int:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.current_device()
    except Exception:
        pass
    return 0


def _known_name(device_name: str, arch: int, sm_count: int) -> str | None:
    """The profile key for this hardware when it is one of ours (same chip, same SM count)."""
    lowered = device_name.lower()
    # Longest keys first so that "h100-pcie" is tried before "h100".
    for key in sorted(KNOWN_PROFILES, key=len, reverse=True):
        p = KNOWN_PROFILES[key]
        if key.split("-")[0] in lowered and p.arch == arch and p.sm_count == sm_count:
            return key
    return None


@functools.cache
def _read_profile(device_index: int) -> DeviceProfile:
    try:
        from cuda.bindings import driver

        _driver_call(driver.cuInit(0), "cuInit")
    except Exception as exc:
        raise RuntimeError(f"no CUDA GPU available: {exc}") from exc
    count = _driver_call(driver.cuDeviceGetCount(), "cuDeviceGetCount")
    if not 0 <= device_index < count:
        raise RuntimeError(f"no CUDA device {device_index} (this machine has {count})")
    dev = _driver_call(driver.cuDeviceGet(device_index), "cuDeviceGet")
    A = driver.CUdevice_attribute

    def attr(name: str) -> int:
        return int(_driver_call(driver.cuDeviceGetAttribute(getattr(A, name), dev), name))

    raw_name = _driver_call(driver.cuDeviceGetName(64, dev), "cuDeviceGetName")
    device_name = raw_name.split(b"\x00")[0].decode(errors="replace").strip()
    arch = (attr("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR") * 10
            + attr("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR"))
    sm_count = attr("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT")
    known = _known_name(device_name, arch, sm_count)
    try:
        # Double data rate: two transfers per memory clock (kHz) over the bus (bits).
        clock_khz = attr("CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE")
        bus_bits = attr("CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH")
        bandwidth = 2.0 * clock_khz * 1e3 * bus_bits / 8 / 1e9
    except Exception:
        bandwidth = 0.0
    if bandwidth <= 0.0 and known:
        bandwidth = KNOWN_PROFILES[known].mem_bandwidth_gbs
    try:
        mem_bytes = int(_driver_call(driver.cuDeviceTotalMem(dev), "cuDeviceTotalMem"))
    except Exception:
        mem_bytes = 0
    return DeviceProfile(
        name=known or device_name.lower().replace(" ", "-"),
        arch=arch,
        sm_count=sm_count,
        warp_size=attr("CU_DEVICE_ATTRIBUTE_WARP_SIZE"),
        max_threads_per_block=attr("CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK"),
        max_threads_per_sm=attr("CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR"),
        regs_per_block=attr("CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK"),
        regs_per_sm=attr("CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR"),
        smem_per_block=attr("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK"),
        smem_per_block_optin=attr("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
        smem_per_sm=attr("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
        l2_bytes=attr("CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE"),
        mem_bandwidth_gbs=round(bandwidth, 1),
        supports_clusters=bool(attr("CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH")),
        max_cluster=KNOWN_PROFILES[known].max_cluster if known else 8,
        gpc_sms=KNOWN_PROFILES[known].gpc_sms if known else (),
        max_blocks_per_sm=attr("CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR"),
        smem_reserved_per_block=attr("CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK"),
        mem_bytes=mem_bytes,
    )


def current_profile(device_index: int | None = None) -> DeviceProfile:
    """The profile of a local GPU (torch's current device by default), read from the driver.

    Raises RuntimeError when there is no GPU.
    """
    return _read_profile(_current_device_index() if device_index is None else device_index)


def resolve_target(target: str | DeviceProfile | None) -> DeviceProfile:
    """None -> the current GPU; a name -> that named profile; a profile -> itself."""
    if target is None:
        return current_profile()
    if isinstance(target, DeviceProfile):
        return target
    if isinstance(target, str):
        return profile_by_name(target)
    raise TypeError(f"target must be a profile name, a DeviceProfile or None, not {target!r}")


# `fusion-cache warmup --target NAME` sets it for the script it runs
TARGET_ENV = "FUSION_CACHE_TARGET"


def default_target() -> str | None:
    """The target `precompile(target=None)` uses: --target of warmup, else the current GPU."""
    return os.environ.get(TARGET_ENV) or None
