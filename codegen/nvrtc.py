"""CUDA C++ source -> cubin (SASS for one real arch) with NVRTC, through cuda-python.

No GPU is needed: a store can be filled ahead of time on a CPU machine. Each call owns its
NVRTC program, and NVRTC allows concurrent calls on distinct programs, so this module holds
no lock.
"""

from __future__ import annotations

import functools
import logging
import re

from cuda.bindings import nvrtc

log = logging.getLogger(__name__)

_SOURCE_LINES_IN_ERROR = 12
_CONTEXT_LINES = 3


class CompileError(RuntimeError):
    """NVRTC refused the source. Carries the full log, source, options and arch."""

    def __init__(self, message: str, *, source: str, log: str, options: tuple[str, ...],
                 arch: int) -> None:
        super().__init__(message)
        self.source = source
        self.log = log
        self.options = options
        self.arch = arch


def _check(result: nvrtc.nvrtcResult, what: str) -> None:
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(result)
        raise RuntimeError(f"{what} failed: {text.decode(errors='replace')}")


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library actually loaded."""
    err, major, minor = nvrtc.nvrtcVersion()
    _check(err, "nvrtcVersion")
    return int(major), int(minor)


@functools.cache
def supported_archs() -> tuple[int, ...]:
    """Real architectures this NVRTC can emit SASS for, e.g. (75, 80, 86, ..., 120)."""
    err, archs = nvrtc.nvrtcGetSupportedArchs()
    _check(err, "nvrtcGetSupportedArchs")
    return tuple(int(a) for a in archs)


_ARCH_RE = re.compile(r"^(?:sm_?)?(\d+)$")
_DOTTED_RE = re.compile(r"^(\d+)\.(\d)$")


def normalize_arch(arch: str | int | tuple[int, int]) -> int:
    """'sm_90', 'sm90', '90', 90, '9.0' and (9, 0) all give 90."""
    value: int | None = None
    if isinstance(arch, bool):
        value = None
    elif isinstance(arch, int):
        value = arch
    elif isinstance(arch, tuple) and len(arch) == 2 and all(isinstance(x, int) for x in arch):
        if 0 <= arch[1] <= 9:
            value = arch[0] * 10 + arch[1]
    elif isinstance(arch, str):
        text = arch.strip().lower()
        if m := _ARCH_RE.match(text):
            value = int(m.group(1))
        elif m := _DOTTED_RE.match(text):
            value = int(m.group(1)) * 10 + int(m.group(2))
    if value is None or not 30 <= value <= 999:
        raise ValueError(
            f"bad GPU architecture {arch!r}: expected e.g. 'sm_90', '90', 90 or '9.0'"
        )
    return value


@functools.cache
def default_options(arch: int) -> tuple[str, ...]:
    """NVRTC options for `arch`, in a fixed order (they are part of the kernel key).

    No --use_fast_math: results must match torch (IEEE division, sqrt, denormals). FMA
    contraction stays on, as in nvcc's default, which is how torch's own kernels are built.
    """
    arch = normalize_arch(arch)
    return (f"--gpu-architecture=sm_{arch}", "--std=c++17", "-default-device")


def _source_excerpt(source: str, log_text: str, name: str) -> str:
    lines = source.splitlines()
    head = lines[:_SOURCE_LINES_IN_ERROR]
    parts = ["first lines of source:"]
    parts += [f"{i + 1:5d} | {line}" for i, line in enumerate(head)]
    # NVRTC reports "name(LINE): error: ..."; show the first error's neighbourhood too.
    m = re.search(rf"{re.escape(name)}\((\d+)\): (?:catastrophic )?error", log_text)
    if m:
        at = int(m.group(1))
        lo, hi = max(at - 1 - _CONTEXT_LINES, 0), min(at + _CONTEXT_LINES, len(lines))
        if hi > len(head):
            parts.append(f"around line {at}:")
            parts += [f"{i + 1:5d} | {lines[i]}" for i in range(max(lo, len(head)), hi)]
    return "\n".join(parts)


def _program_log(prog: nvrtc.nvrtcProgram) -> str:
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    _check(err, "nvrtcGetProgramLogSize")
    # a fresh mutable buffer: NVRTC writes into it, and `b" " * 1` would be CPython's shared
    # one-byte constant (writing '\0' there corrupted every b" " in the process)
    buf = bytearray(size)
    (err,) = nvrtc.nvrtcGetProgramLog(prog, buf)
    _check(err, "nvrtcGetProgramLog")
    return buf.rstrip(b"\x00").decode(errors="replace").strip()


def compile_cubin_with_log(
    source: str,
    arch: str | int,
    *,
    name: str = "fusion.cu",
    options: tuple[str, ...] | None = None,
) -> tuple[bytes, str]:
    """Like compile_cubin, and also returns NVRTC's log (warnings; usually empty)."""
    arch = normalize_arch(arch)
    opts = default_options(arch) if options is None else tuple(options)
    if arch not in supported_archs():
        major, minor = nvrtc_version()
        raise CompileError(
            f"NVRTC {major}.{minor} cannot emit SASS for sm_{arch}; it supports "
            + ", ".join(f"sm_{a}" for a in supported_archs()),
            source=source, log="", options=opts, arch=arch,
        )
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        log_text = _program_log(prog)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(
                f"NVRTC failed to compile {name} for sm_{arch} ({err.name}) with options "
                f"{' '.join(opts)}:\n{log_text}\n{_source_excerpt(source, log_text, name)}",
                source=source, log=log_text, options=opts, arch=arch,
            )
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(err, "nvrtcGetCUBINSize")
        cubin_buf = bytearray(size)
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin_buf)
        cubin = bytes(cubin_buf)
        _check(err, "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    if log_text:
        log.debug("NVRTC log for %s (sm_%d):\n%s", name, arch, log_text)
    return cubin, log_text


def compile_cubin(
    source: str,
    arch: str | int,
    *,
    name: str = "fusion.cu",
    options: tuple[str, ...] | None = None,
) -> bytes:
    """Compile CUDA C++ `source` to a cubin for the real arch `arch` (e.g. 90 -> sm_90).

    Kernels should be `extern "C" __global__` so their names are not mangled. options=None
    means default_options(arch). Raises CompileError (with NVRTC's log) on failure.
    """
    return compile_cubin_with_log(source, arch, name=name, options=options)[0]
