"""cubin -> loaded CUDA function -> launches on torch's current stream.

Modules live in the device's primary context, the one torch's runtime uses, so our kernels
and torch's ops share streams and memory. Launches are on the hot path of every cache hit:
arguments are packed by one precompiled struct.pack_into into a per-thread buffer whose
slot addresses form the kernelParams array, handed to the driver's launch entry point
through ctypes (Note [Launch through ctypes]). A launch replayed many times with the same
grid and constants is bound once (`LoadedKernel.bind`, Note [Bound launches]).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import operator
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

from cuda.bindings import driver

_SUCCESS = driver.CUresult.CUDA_SUCCESS
_DEFAULT_MAX_DYNAMIC_SMEM = 48 * 1024
_STRUCT_CODES = {"ptr": "Q", "i64": "q", "u64": "Q", "i32": "i", "f64": "d", "f32": "f",
                 "bool": "?"}
ARG_TYPES = frozenset(_STRUCT_CODES)


class ModuleLoadError(RuntimeError):
    """The driver refused the cubin (wrong arch, corrupt bytes, ...). Treat as a cache miss."""

    def __init__(self, message: str, result_name: str) -> None:
        super().__init__(message)
        self.result_name = result_name


class LaunchError(RuntimeError):
    """cuLaunchKernel refused the launch, or the arguments do not match arg_types."""

    def __init__(self, message: str, result_name: str | None = None) -> None:
        super().__init__(message)
        self.result_name = result_name


def _name(err) -> str:
    return getattr(err, "name", str(err))


def _check(result: tuple, what: str):
    """Unwrap a cuda-bindings (err, value) result, raising RuntimeError on failure."""
    err, *values = result
    if err != _SUCCESS:
        raise RuntimeError(f"{what} failed: {_name(err)}")
    return values[0] if len(values) == 1 else None


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    """True when a CUDA driver is present and sees at least one device. Never raises."""
    try:
        (err,) = driver.cuInit(0)
        if err != _SUCCESS:
            return False
        err, count = driver.cuDeviceGetCount()
        return err == _SUCCESS and count > 0
    except Exception:
        return False


# ---- the driver's launch entry points --------------------------------------------------------

# Note [Launch through ctypes]: cuda-python's cuLaunchKernel converts each of its eleven
# arguments through its own wrappers, releases and retakes the GIL, and wraps the result in
# an enum: most of the 8-12 us one launch cost the host on the H100 (cProfile of GPT-2
# training). The driver's own symbols, called through ctypes with their argtypes set once,
# take plain ints. PyDLL keeps the GIL for the call, as torch's own launches do (a launch
# queues work and returns; it blocks only while the driver's queue is full). The result is
# the CUresult as an int: 0 is success, anything else is named through cuda-python's enum,
# off the hot path. Everything else (modules, attributes, contexts) stays on cuda-python.


class _Driver:
    """cuLaunchKernel and cuLaunchKernelEx of the loaded CUDA driver library."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        ptr, uint = ctypes.c_void_p, ctypes.c_uint
        self.launch = lib.cuLaunchKernel
        self.launch.argtypes = [ptr, uint, uint, uint, uint, uint, uint, uint, ptr, ptr, ptr]
        self.launch.restype = ctypes.c_int
        self.launch_ex = lib.cuLaunchKernelEx
        self.launch_ex.argtypes = [ptr, ptr, ptr, ptr]
        self.launch_ex.restype = ctypes.c_int


_DRIVER_LIBRARIES = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")


@functools.lru_cache(maxsize=1)
def _driver() -> _Driver:
    errors = []
    for name in _DRIVER_LIBRARIES:  # cuda-python has loaded it already: the same handle
        try:
            return _Driver(ctypes.PyDLL(name))
        except (OSError, AttributeError) as exc:
            errors.append(f"{name}: {exc}")
    raise LaunchError("cannot load the CUDA driver library: " + "; ".join(errors))


_INVALID_CONTEXT = int(driver.CUresult.CUDA_ERROR_INVALID_CONTEXT)


def _result_name(err: int) -> str:
    try:
        return driver.CUresult(err).name
    except ValueError:
        return f"CUresult {err}"


# ---- contexts and streams -------------------------------------------------------------------

_lock = threading.RLock()
_contexts: dict[int, driver.CUcontext] = {}


def _resolve_device(device_index: int | None) -> int:
    import torch

    torch.cuda.init()  # torch first: it owns the primary contexts we share
    return torch.cuda.current_device() if device_index is None else int(device_index)


def _primary_context(device_index: int) -> driver.CUcontext:
    ctx = _contexts.get(device_index)
    if ctx is None:
        with _lock:
            ctx = _contexts.get(device_index)
            if ctx is None:
                _check(driver.cuInit(0), "cuInit")
                dev = _check(driver.cuDeviceGet(device_index), "cuDeviceGet")
                # Retained for the life of the process: loaded modules live in it.
                ctx = _check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
                _contexts[device_index] = ctx
    return ctx


@functools.lru_cache(maxsize=1)
def _device_count() -> int:
    return int(_check(driver.cuDeviceGetCount(), "cuDeviceGetCount"))


@functools.lru_cache(maxsize=1)
def _raw_stream_getter():
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw  # an int, without building a torch.cuda.Stream object
    return lambda index: torch.cuda.current_stream(index).cuda_stream


def current_raw_stream(device_index: int) -> int:
    """torch's current stream on the device, as a raw cudaStream_t int."""
    global _raw_stream
    if _raw_stream is None:
        _raw_stream = _raw_stream_getter()
    return _raw_stream(device_index)


_raw_stream = None
_streams: dict[int, driver.CUstream] = {}


def _stream_handle(stream: int) -> driver.CUstream:
    # cuLaunchKernel would wrap an int in a new CUstream on every call; reuse one per stream.
    handle = _streams.get(stream)
    if handle is None:
        if len(_streams) > 4096:
            _streams.clear()
        handle = _streams[stream] = driver.CUstream(stream)
    return handle


# ---- argument packing -----------------------------------------------------------------------

class _Packer:
    """Packs one arg_types signature into a C-layout buffer; kernelParams points into it.
    The unbound launches' path (execute(), tests); replays use Note [Bound launches]."""

    __slots__ = ("pack_into", "buffer", "slots", "params")

    def __init__(self, arg_types: tuple[str, ...]) -> None:
        codes = [_code(t) for t in arg_types]
        layout = struct.Struct("@" + "".join(codes))  # native alignment, as a C struct
        offsets = _offsets(codes)
        self.pack_into = layout.pack_into
        self.buffer = ctypes.create_string_buffer(max(layout.size, 8))
        base = ctypes.addressof(self.buffer)
        self.slots = (ctypes.c_void_p * max(len(codes), 1))(*[base + o for o in offsets])
        self.params = ctypes.addressof(self.slots) if codes else 0


_tls = threading.local()


def _packer(arg_types: tuple[str, ...]) -> _Packer:
    # Per thread: the driver reads the buffer during cuLaunchKernel, which may release the GIL.
    packers = getattr(_tls, "packers", None)
    if packers is None:
        packers = _tls.packers = {}
    packer = packers.get(arg_types)
    if packer is None:
        packer = packers[tuple(arg_types)] = _Packer(tuple(arg_types))
    return packer


# ---- kernels --------------------------------------------------------------------------------

_PORTABLE_CLUSTER = 8  # blocks a cluster may have without opting in
_modules: dict[tuple[str, int], driver.CUmodule] = {}
_kernels: dict[tuple[str, str, int], LoadedKernel] = {}


class LoadedKernel:
    """One function of a loaded cubin on one device."""

    def __init__(self, name: str, device_index: int, function: driver.CUfunction,
                 context: driver.CUcontext) -> None:
        self.name = name
        self.device_index = device_index
        self._function = function
        self._handle = int(function)  # the CUfunction, as ctypes takes it
        self._context = context
        self._context_handle = int(context)
        self._check_context = _device_count() > 1
        self._driver = _driver()
        self._current_stream = _raw_stream_getter()
        self._configs: dict = {}  # cuLaunchKernelEx configs, per launch shape, stream and kind

        def attr(a: driver.CUfunction_attribute) -> int:
            return int(_check(driver.cuFuncGetAttribute(a, function), "cuFuncGetAttribute"))

        fa = driver.CUfunction_attribute
        self.num_regs = attr(fa.CU_FUNC_ATTRIBUTE_NUM_REGS)
        self.max_threads_per_block = attr(fa.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
        self.static_smem_bytes = attr(fa.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
        self.local_bytes = attr(fa.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)
        # without opting in, static and dynamic shared memory together stop at 48 KiB
        self._max_dynamic_smem = max(0, _DEFAULT_MAX_DYNAMIC_SMEM - self.static_smem_bytes)
        self.cluster_dims = (max(1, attr(fa.CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH)),
                             max(1, attr(fa.CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT)))
        if self.cluster_dims[0] * self.cluster_dims[1] > _PORTABLE_CLUSTER:
            # clusters of 16 blocks (sm_90) launch only once the kernel opts in
            allow = fa.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
            _check(driver.cuFuncSetAttribute(function, allow, 1), "cuFuncSetAttribute")

    def __repr__(self) -> str:
        return (f"LoadedKernel({self.name!r}, device={self.device_index}, regs={self.num_regs}, "
                f"static_smem={self.static_smem_bytes}, local={self.local_bytes})")

    def launch(
        self,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        arg_types: tuple[str, ...],
        args: Sequence,
        shared_mem: int = 0,
        stream: int | None = None,
        cooperative: bool = False,
        dependent: bool = False,
    ) -> None:
        """Launch on `stream` (a raw cudaStream_t int; None: torch's current stream).

        arg_types items: 'ptr' (an int such as tensor.data_ptr()), 'i64', 'u64', 'i32',
        'f64', 'f32', 'bool', in the kernel's parameter order. `cooperative`: every block resident at once
        or no launch (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE), for kernels with a grid barrier.
        `dependent`: may start before the stream's previous kernel ends; the kernel must call
        fc_wait_prior_grid before touching memory (Note [Dependent launch]).
        """
        packer = _packer(arg_types)
        try:
            packer.pack_into(packer.buffer, 0, *args)
        except struct.error as exc:
            raise LaunchError(
                f"{self.name}: arguments {tuple(args)!r} do not fit {tuple(arg_types)}: {exc}"
            ) from None
        if shared_mem > self._max_dynamic_smem:
            self._allow_dynamic_smem(shared_mem)
        if stream is None:
            stream = self._current_stream(self.device_index)
        # cuLaunchKernelEx for every launch: through ctypes, its four arguments cost less to
        # convert than cuLaunchKernel's eleven (H100: 3.7 us a launch against 5.4)
        config = self._config(grid, block, shared_mem, stream, cooperative, dependent)
        if not self._check_context:
            err = self._driver.launch_ex(config.getPtr(), self._handle, packer.params, None)
            if not err:
                return
        call = functools.partial(self._driver.launch_ex, config.getPtr(), self._handle,
                                 packer.params, None)  # fmt: skip
        if self._check_context:
            err = self._in_own_context(call)
        if err:
            self._recover(err, call, grid, block, shared_mem)

    def bind(self, grid: tuple[int, int, int], block: tuple[int, int, int],
             arg_types: tuple[str, ...], template: Sequence, pointers: Sequence[tuple[int, int]],
             values: Sequence[tuple[int, int]], shared_mem: int = 0, cooperative: bool = False,
             dependent: bool = False) -> BoundLaunch:  # fmt: skip
        """A launch of this kernel replayed with `grid`, `block`, `shared_mem` and the
        constant arguments of `template` (Note [Bound launches])."""
        return BoundLaunch(self, grid, block, arg_types, template, pointers, values, shared_mem,
                           cooperative, dependent)  # fmt: skip

    def _config(self, grid, block, shared_mem, stream, cooperative, dependent):
        # one config a launch shape, stream and kind, built once (its attribute list costs
        # more to make than the launch itself) and never changed, so threads may share them;
        # the unbound route's launches of a run go round a few shapes, well under the bound
        key = (tuple(grid), tuple(block), shared_mem, stream, cooperative, dependent)
        config = self._configs.get(key)
        if config is None:
            if len(self._configs) > 256:
                self._configs.clear()
            config = self._configs[key] = launch_config(grid, block, shared_mem, stream,
                                                        cooperative, dependent)  # fmt: skip
        return config

    def _recover(self, err: int, call: Callable[[], int], grid, block, shared_mem) -> None:
        """After a failed launch: adopt the primary context where the thread had none and
        launch again, else raise."""
        if err == _INVALID_CONTEXT:
            # A thread where neither torch nor we have run CUDA yet has no current
            # context; adopt the primary one, as torch's runtime would.
            _check(driver.cuCtxSetCurrent(self._context), "cuCtxSetCurrent")
            err = call()
        if err:
            self._raise_launch_error(err, grid, block, shared_mem)

    def _in_own_context(self, launch: Callable[[], int]) -> int:
        """`launch()`'s CUresult, run with our context current. Several GPUs: the thread's
        current context may belong to another device; ours is pushed for the launch instead
        of switched to, so torch's idea of the current device holds."""
        err, current = driver.cuCtxGetCurrent()
        pushed = err != _SUCCESS or int(current) != self._context_handle
        if pushed:
            _check(driver.cuCtxPushCurrent(self._context), "cuCtxPushCurrent")
        try:
            return launch()
        finally:
            if pushed:
                driver.cuCtxPopCurrent()

    def max_resident(self, block: tuple[int, int, int], shared_mem: int = 0) -> int:
        """Clusters of this kernel (blocks, where it has no cluster dims) the device runs at
        once with `block` threads a block: one wave. 0 when the driver cannot say."""
        if shared_mem > self._max_dynamic_smem:
            self._allow_dynamic_smem(shared_mem)
        _check(driver.cuCtxPushCurrent(self._context), "cuCtxPushCurrent")
        try:
            if self.cluster_dims == (1, 1):
                err, per_sm = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    self._function, block[0] * block[1] * block[2], shared_mem)
                device = _check(driver.cuDeviceGet(self.device_index), "cuDeviceGet")
                err2, sms = driver.cuDeviceGetAttribute(
                    driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device)
                return per_sm * sms if err == _SUCCESS and err2 == _SUCCESS else 0
            config = driver.CUlaunchConfig()
            config.gridDimX, config.gridDimY, config.gridDimZ = (*self.cluster_dims, 1)
            config.blockDimX, config.blockDimY, config.blockDimZ = block
            config.sharedMemBytes = shared_mem
            config.numAttrs = 0
            err, clusters = driver.cuOccupancyMaxActiveClusters(self._function, config)
            return clusters if err == _SUCCESS else 0
        finally:
            driver.cuCtxPopCurrent()

    def _allow_dynamic_smem(self, shared_mem: int) -> None:
        attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        (err,) = driver.cuFuncSetAttribute(self._function, attribute, shared_mem)
        if err != _SUCCESS:
            raise LaunchError(
                f"{self.name}: cannot allow {shared_mem} bytes of dynamic shared memory "
                f"({_name(err)})", _name(err),
            )
        self._max_dynamic_smem = shared_mem

    def _raise_launch_error(self, err: int, grid, block, shared_mem) -> None:
        name = _result_name(err)
        raise LaunchError(
            f"cuLaunchKernel({self.name}, grid={tuple(grid)}, block={tuple(block)}, "
            f"shared_mem={shared_mem}) failed: {name}", name,
        )


def launch_config(grid, block, shared_mem: int, stream: int, cooperative: bool,
                  dependent: bool) -> driver.CUlaunchConfig:  # fmt: skip
    """cuLaunchKernelEx's config (kept alive by its caller: the driver reads getPtr())."""
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = shared_mem
    attrs = []
    if cooperative:
        attribute = driver.CUlaunchAttribute()
        attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        attribute.value.cooperative = 1
        attrs.append(attribute)
    if dependent:
        attribute = driver.CUlaunchAttribute()
        attribute.id = (driver.CUlaunchAttributeID
                        .CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
        attribute.value.programmaticStreamSerializationAllowed = 1
        attrs.append(attribute)
    config.attrs, config.numAttrs = attrs, len(attrs)
    config.hStream = _stream_handle(stream)
    return config


# ---- bound launches -------------------------------------------------------------------------

# Note [Bound launches]: a launch sequence (fusion_cache/runtime/sequence.py) replays the same
# launches call after call: the kernel, grid, block, shared memory and the constant arguments
# (sizes, strides, scalars the plan fixed) never change, only the tensors' addresses and the
# scalars read from the inputs do. A bound launch packs the constants once into a buffer of
# their own, and gives the variable arguments a second, contiguous one, so a replay is one
# struct.pack_into of the addresses (C-level maps over the call's values) and one driver call
# whose four arguments are all fixed: cuLaunchKernelEx with a config built once per bound
# launch, its stream rewritten only when torch's current stream changes. The kernelParams
# array points each argument at its slot in one buffer or the other. The buffers belong to
# the thread that bound the launch; another thread replaying it takes the unbound route.


class LaunchSite:
    """One launch of a kernel with its grid, block and constant arguments fixed: `template`
    holds the arguments, None where `pointers` ((position, index): the data_ptr of
    `values_list[index]`) or `values` ((position, index): `values_list[index]` itself) fill
    them on each call. This base launches through `kernel.launch` (stubs, other threads)."""

    __slots__ = ("kernel", "grid", "block", "arg_types", "template", "pointers", "values",
                 "shared_mem", "cooperative", "dependent")  # fmt: skip

    def __init__(self, kernel: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
                 arg_types: tuple[str, ...], template: Sequence,
                 pointers: Sequence[tuple[int, int]], values: Sequence[tuple[int, int]],
                 shared_mem: int = 0, cooperative: bool = False,
                 dependent: bool = False) -> None:  # fmt: skip
        self.kernel = kernel
        self.grid, self.block, self.shared_mem = tuple(grid), tuple(block), shared_mem
        self.arg_types, self.template = tuple(arg_types), tuple(template)
        self.pointers, self.values = tuple(pointers), tuple(values)
        self.cooperative, self.dependent = cooperative, dependent

    def args(self, env: Sequence[Any]) -> list:
        """The launch's arguments for the values in `env`."""
        args = list(self.template)
        for pos, index in self.pointers:
            args[pos] = env[index].data_ptr()
        for pos, index in self.values:
            args[pos] = env[index]
        return args

    def __call__(self, env: Sequence[Any]) -> None:
        self.kernel.launch(self.grid, self.block, self.arg_types, self.args(env),
                           self.shared_mem, cooperative=self.cooperative,
                           dependent=self.dependent)  # fmt: skip

    def replay(self) -> None:
        """Launch again with the arguments of the last call (benchmarks: launches alone)."""
        raise NotImplementedError


_unbound = [0]  # bound launches called off their binding thread (the unbound route)


def unbound_launches() -> int:
    """How many bound launches have run the unbound route, off the thread that bound them
    (each pays LoadedKernel.launch's packing and config lookup): benchmarks count it a step."""
    return _unbound[0]


class BoundLaunch(LaunchSite):
    """A LaunchSite of a LoadedKernel, launched by the driver with its constants packed
    once (Note [Bound launches])."""

    __slots__ = ("_fill", "_variable", "_pointers_of", "_values_of", "_buffers", "_config",
                 "_call", "_stream", "_current_stream", "_device_index", "_thread",
                 "_data_ptr")  # fmt: skip

    def __init__(self, kernel: LoadedKernel, *args: Any, **kwargs: Any) -> None:
        super().__init__(kernel, *args, **kwargs)
        import torch

        codes = [_code(t) for t in self.arg_types]
        if len(self.template) != len(codes):
            raise LaunchError(f"{kernel.name}: {len(self.template)} arguments for "
                              f"{len(codes)} types {self.arg_types}")  # fmt: skip
        variable = [pos for pos, _ in self.pointers] + [pos for pos, _ in self.values]
        constant = [0 if pos in variable else a for pos, a in enumerate(self.template)]
        fixed = struct.Struct("@" + "".join(codes))
        moving = struct.Struct("@" + "".join(codes[pos] for pos in variable))
        fixed_buffer = ctypes.create_string_buffer(max(fixed.size, 8))
        moving_buffer = ctypes.create_string_buffer(max(moving.size, 8))
        try:
            fixed.pack_into(fixed_buffer, 0, *constant)
        except struct.error as exc:
            raise LaunchError(f"{kernel.name}: arguments {self.template!r} do not fit "
                              f"{self.arg_types}: {exc}") from None  # fmt: skip
        addresses = [ctypes.addressof(fixed_buffer) + o for o in _offsets(codes)]
        moving_base = ctypes.addressof(moving_buffer)
        for pos, offset in zip(variable, _offsets([codes[pos] for pos in variable])):
            addresses[pos] = moving_base + offset
        params = (ctypes.c_void_p * max(len(codes), 1))(*addresses)
        self._buffers = (fixed_buffer, moving_buffer, params)  # alive while the driver may read
        self._variable = moving_buffer
        self._fill = moving.pack_into if variable else None
        self._pointers_of = _getter(tuple(index for _, index in self.pointers))
        self._values_of = _getter(tuple(index for _, index in self.values))
        self._data_ptr = torch.Tensor.data_ptr
        if self.shared_mem > kernel._max_dynamic_smem:
            kernel._allow_dynamic_smem(self.shared_mem)
        self._device_index = kernel.device_index
        self._current_stream = kernel._current_stream
        self._stream = self._current_stream(self._device_index)
        self._config = launch_config(self.grid, self.block, self.shared_mem, self._stream,
                                     self.cooperative, self.dependent)  # fmt: skip
        call = functools.partial(kernel._driver.launch_ex, self._config.getPtr(),
                                 kernel._handle, ctypes.addressof(params) if codes else None,
                                 None)  # fmt: skip
        self._call = functools.partial(kernel._in_own_context, call) if kernel._check_context \
            else call
        self._thread = threading.get_ident()

    def __call__(self, env: Sequence[Any]) -> None:
        if threading.get_ident() != self._thread:
            _unbound[0] += 1
            return LaunchSite.__call__(self, env)  # the buffers are the binding thread's
        if self._fill is not None:
            try:
                if self._values_of is None:
                    self._fill(self._variable, 0, *map(self._data_ptr, self._pointers_of(env)))
                elif self._pointers_of is None:
                    self._fill(self._variable, 0, *self._values_of(env))
                else:
                    self._fill(self._variable, 0, *map(self._data_ptr, self._pointers_of(env)),
                               *self._values_of(env))  # fmt: skip
            except struct.error as exc:
                raise LaunchError(f"{self.kernel.name}: arguments {self.args(env)!r} do not "
                                  f"fit {self.arg_types}: {exc}") from None  # fmt: skip
        stream = self._current_stream(self._device_index)
        if stream != self._stream:
            self._config.hStream = _stream_handle(stream)
            self._stream = stream
        err = self._call()
        if err:
            self.kernel._recover(err, self._call, self.grid, self.block, self.shared_mem)

    def replay(self) -> None:
        err = self._call()
        if err:
            self.kernel._recover(err, self._call, self.grid, self.block, self.shared_mem)

    def binding(self) -> tuple[int, int, Callable[[int], int]]:
        """(the binding thread, the device index, torch's current-stream getter)."""
        return self._thread, self._device_index, self._current_stream

    def inlined(self) -> tuple | None:
        """(fill, buffer, pointers, call) for a caller that replays this launch itself on the
        binding thread with the stream it was last launched on (Note [Inline launches] in
        fusion_cache/runtime/sequence.py): `fill(buffer, 0, *data_ptrs of pointers(env))`
        (fill None: nothing varies), then `call()`, nonzero on failure. None for a launch
        that reads scalars as well: the caller calls it."""
        if self._values_of is not None:
            return None
        return self._fill, self._variable, self._pointers_of, self._call


def _getter(indices: tuple[int, ...]) -> Callable[[Sequence[Any]], tuple] | None:
    """The values at `indices` of a list, as a tuple, in one C call where there are several."""
    if not indices:
        return None
    if len(indices) == 1:  # indexing, not a slice: a sequence records on a dict of slots
        (index,) = indices
        return lambda env: (env[index],)
    return operator.itemgetter(*indices)


def _code(arg_type: str) -> str:
    try:
        return _STRUCT_CODES[arg_type]
    except KeyError:
        raise LaunchError(
            f"unknown arg type {arg_type!r}; known: {', '.join(sorted(ARG_TYPES))}") from None


def _offsets(codes: Sequence[str]) -> list[int]:
    """Offset of each item of a native-aligned struct: the size of the prefix ending with
    it, minus its own size."""
    return [struct.calcsize("@" + "".join(codes[: i + 1])) - struct.calcsize(codes[i])
            for i in range(len(codes))]  # fmt: skip


def _load_function(cubin: bytes, digest: str, kernel_name: str,
                   device_index: int) -> driver.CUfunction:
    # Runs with the device's primary context pushed.
    module = _modules.get((digest, device_index))
    if module is None:
        err, module = driver.cuModuleLoadData(cubin)
        if err != _SUCCESS:
            raise ModuleLoadError(
                f"cuModuleLoadData refused a {len(cubin)}-byte cubin (sha256 {digest[:16]}) "
                f"on device {device_index}: {_name(err)}", _name(err),
            )
        _modules[(digest, device_index)] = module
    err, function = driver.cuModuleGetFunction(module, kernel_name.encode())
    if err != _SUCCESS:
        raise ModuleLoadError(
            f"kernel {kernel_name!r} not found in cubin {digest[:16]}: {_name(err)}", _name(err)
        )
    return function


def load_kernel(cubin: bytes, kernel_name: str, device_index: int | None = None) -> LoadedKernel:
    """Load `kernel_name` from `cubin` on a device (torch's current device by default).

    Cached per (sha256 of cubin, kernel name, device): loading twice returns the same object.
    Raises ModuleLoadError when the driver refuses the cubin or the kernel is not in it.
    """
    device = _resolve_device(device_index)
    digest = hashlib.sha256(cubin).hexdigest()
    key = (digest, kernel_name, device)
    kernel = _kernels.get(key)
    if kernel is not None:
        return kernel
    with _lock:
        kernel = _kernels.get(key)
        if kernel is not None:
            return kernel
        ctx = _primary_context(device)
        _check(driver.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
        try:
            function = _load_function(bytes(cubin), digest, kernel_name, device)
            kernel = LoadedKernel(kernel_name, device, function, ctx)
        finally:
            driver.cuCtxPopCurrent()
        _kernels[key] = kernel
    return kernel
