"""Launches through ctypes (Note [Launch through ctypes]) and bound launches (Note [Bound
launches]) on the CPU: the driver's cuLaunchKernel and cuLaunchKernelEx are replaced by ctypes
callbacks of the same C prototypes, which decode what the driver would read (the config, the
kernelParams array and the argument bytes it points to), so the marshalling is checked here;
tests/gpu/test_launch.py runs the same paths on the GPU."""

import ctypes
import struct
import threading

import pytest

torch = pytest.importorskip("torch")

from codegen import launch as launch_module  # noqa: E402
from codegen.launch import BoundLaunch, LaunchError, LoadedKernel  # noqa: E402

_CODES = {"ptr": "Q", "i64": "q", "u64": "Q", "i32": "i", "f64": "d", "f32": "f", "bool": "?"}
_PTR, _UINT = ctypes.c_void_p, ctypes.c_uint
_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, _PTR, _UINT, _UINT, _UINT, _UINT, _UINT, _UINT, _UINT,
                           _PTR, _PTR, _PTR)  # fmt: skip
_LAUNCH_EX = ctypes.CFUNCTYPE(ctypes.c_int, _PTR, _PTR, _PTR, _PTR)


class _Attribute(ctypes.Structure):  # CUlaunchAttribute: an id, padding, a 64-byte union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("rest", ctypes.c_char * 60)]  # fmt: skip


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_mem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attribute)), ("num_attrs", ctypes.c_uint)]  # fmt: skip


class _FakeDriver:
    """Records each launch as the driver would see it; `result` is what the next returns."""

    def __init__(self, arg_types: tuple[str, ...]) -> None:
        self.arg_types = arg_types
        self.calls: list[dict] = []
        self.results: list[int] = []
        self.launch = _LAUNCH(self._launch)
        self.launch_ex = _LAUNCH_EX(self._launch_ex)

    def _args(self, params: int) -> list:
        slots = (ctypes.c_void_p * len(self.arg_types)).from_address(params)
        out = []
        for t, address in zip(self.arg_types, slots):
            code = _CODES[t]
            out.append(struct.unpack(code, ctypes.string_at(address, struct.calcsize(code)))[0])
        return out

    def _result(self) -> int:
        return self.results.pop(0) if self.results else 0

    def _launch(self, function, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        self.calls.append({"function": function, "grid": (gx, gy, gz), "block": (bx, by, bz),
                           "smem": smem, "stream": stream or 0, "args": self._args(params),
                           "attrs": ()})  # fmt: skip
        return self._result()

    def _launch_ex(self, config, function, params, extra):
        c = _Config.from_address(config)
        attrs = tuple(sorted((c.attrs[i].id, c.attrs[i].value) for i in range(c.num_attrs)))
        self.calls.append({"function": function, "grid": tuple(c.grid), "block": tuple(c.block),
                           "smem": c.shared_mem, "stream": c.stream or 0,
                           "args": self._args(params), "attrs": attrs})  # fmt: skip
        return self._result()


TYPES = ("ptr", "i32", "i64", "ptr", "f32", "bool", "f64", "ptr", "u64")
STREAM = 0x7000


def _kernel(driver: _FakeDriver, streams: list[int] | None = None) -> LoadedKernel:
    """A LoadedKernel as load_kernel makes it, minus the module: its launch paths are real."""
    kernel = LoadedKernel.__new__(LoadedKernel)
    kernel.name = "fake_kernel"
    kernel.device_index = 0
    kernel._function = launch_module.driver.CUfunction(0x1234)
    kernel._handle = 0x1234
    kernel._context = None
    kernel._context_handle = 0
    kernel._check_context = False
    kernel._driver = driver
    current = streams if streams is not None else [STREAM]
    kernel._current_stream = lambda index: current[0]
    kernel._configs = {}
    kernel._max_dynamic_smem = 48 * 1024
    return kernel


def _env() -> list:
    return [torch.randn(4), torch.randn(8, dtype=torch.float64), torch.zeros(3, dtype=torch.int32),
            2.5, -7]  # fmt: skip


TEMPLATE = (None, 11, -(2**40), None, None, True, 0.25, None, 2**63 + 5)
POINTERS = ((0, 1), (3, 0), (7, 2))  # (argument position, env index)
VALUES = ((4, 3),)


def _want(env: list) -> list:
    return [env[1].data_ptr(), 11, -(2**40), env[0].data_ptr(), 2.5, True, 0.25,
            env[2].data_ptr(), 2**63 + 5]  # fmt: skip


def test_unbound_launch_passes_every_argument_and_the_stream():
    driver = _FakeDriver(TYPES)
    env = _env()
    _kernel(driver).launch((3, 2, 1), (128, 1, 1), TYPES, _want(env), 256)
    (call,) = driver.calls
    assert call == {"function": 0x1234, "grid": (3, 2, 1), "block": (128, 1, 1), "smem": 256,
                    "stream": STREAM, "args": _want(env), "attrs": ()}  # fmt: skip


def test_bound_launch_packs_constants_once_and_fills_pointers_each_call():
    driver = _FakeDriver(TYPES)
    kernel = _kernel(driver)
    bound = kernel.bind((5, 1, 1), (64, 2, 1), TYPES, TEMPLATE, POINTERS, VALUES, 1024)
    assert isinstance(bound, BoundLaunch)
    for _ in range(3):  # fresh tensors each call: the pointers follow them
        env = _env()
        bound(env)
        call = driver.calls[-1]
        assert call["args"] == _want(env)
        assert (call["grid"], call["block"], call["smem"]) == ((5, 1, 1), (64, 2, 1), 1024)
        assert call["stream"] == STREAM and call["attrs"] == ()
    assert len(driver.calls) == 3


def test_bound_launch_follows_the_current_stream():
    driver = _FakeDriver(TYPES)
    streams = [STREAM]
    bound = _kernel(driver, streams).bind((1, 1, 1), (32, 1, 1), TYPES, TEMPLATE, POINTERS,
                                          VALUES)  # fmt: skip
    env = _env()
    for stream in (STREAM, 0x9000, 0x9000, 0, STREAM):
        streams[0] = stream
        bound(env)
        assert driver.calls[-1]["stream"] == stream


def test_bound_cooperative_and_dependent_launches_carry_their_attributes():
    driver = _FakeDriver(TYPES)
    kernel = _kernel(driver)
    ids = launch_module.driver.CUlaunchAttributeID
    coop = int(ids.CU_LAUNCH_ATTRIBUTE_COOPERATIVE)
    dep = int(ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
    for cooperative, dependent, attrs in ((True, False, ((coop, 1),)),
                                          (False, True, ((dep, 1),)),
                                          (True, True, tuple(sorted(((coop, 1), (dep, 1))))),
                                          (False, False, ())):  # fmt: skip
        env = _env()
        kernel.bind((2, 1, 1), (32, 1, 1), TYPES, TEMPLATE, POINTERS, VALUES,
                    cooperative=cooperative, dependent=dependent)(env)  # fmt: skip
        assert driver.calls[-1]["attrs"] == attrs and driver.calls[-1]["args"] == _want(env)
        # the unbound route of the same launch says the same
        kernel.launch((2, 1, 1), (32, 1, 1), TYPES, _want(env), cooperative=cooperative,
                      dependent=dependent)  # fmt: skip
        assert driver.calls[-1]["attrs"] == attrs and driver.calls[-1]["args"] == _want(env)


def test_kernels_with_none_or_one_variable_argument_bind():
    types = ("i32", "f32")
    driver = _FakeDriver(types)
    _kernel(driver).bind((1, 1, 1), (1, 1, 1), types, (3, 0.5), (), ())([])
    assert driver.calls[-1]["args"] == [3, 0.5]
    _kernel(driver).bind((1, 1, 1), (1, 1, 1), types, (3, None), (), ((1, 0),))([-1.5])
    assert driver.calls[-1]["args"] == [3, -1.5]
    types = ("i32", "ptr")
    driver = _FakeDriver(types)
    env = [torch.randn(3)]
    _kernel(driver).bind((1, 1, 1), (1, 1, 1), types, (3, None), ((1, 0),), ())(env)
    assert driver.calls[-1]["args"] == [3, env[0].data_ptr()]


def test_a_failed_launch_raises_naming_the_kernel_and_the_result():
    driver = _FakeDriver(TYPES)
    kernel = _kernel(driver)
    bound = kernel.bind((1, 1, 1), (32, 1, 1), TYPES, TEMPLATE, POINTERS, VALUES)
    invalid_value = int(launch_module.driver.CUresult.CUDA_ERROR_INVALID_VALUE)
    driver.results = [invalid_value]
    with pytest.raises(LaunchError, match="fake_kernel.*CUDA_ERROR_INVALID_VALUE") as info:
        bound(_env())
    assert info.value.result_name == "CUDA_ERROR_INVALID_VALUE"
    driver.results = [invalid_value]
    with pytest.raises(LaunchError, match="fake_kernel.*CUDA_ERROR_INVALID_VALUE"):
        kernel.launch((1, 1, 1), (32, 1, 1), TYPES, _want(_env()))


def test_arguments_that_do_not_fit_raise_naming_the_kernel():
    driver = _FakeDriver(TYPES)
    kernel = _kernel(driver)
    with pytest.raises(LaunchError, match="fake_kernel"):  # a constant: at bind time
        kernel.bind((1, 1, 1), (1, 1, 1), TYPES, (None, 2**40, *TEMPLATE[2:]), POINTERS, VALUES)
    bound = kernel.bind((1, 1, 1), (1, 1, 1), TYPES, TEMPLATE, POINTERS, VALUES)
    env = _env()
    env[3] = "not a float"
    with pytest.raises(LaunchError, match="fake_kernel"):  # a value read each call
        bound(env)
    assert not driver.calls


def test_another_thread_replays_a_bound_launch_through_the_unbound_route():
    """The packed buffers are the binding thread's (Note [Bound launches])."""
    driver = _FakeDriver(TYPES)
    bound = _kernel(driver).bind((1, 1, 1), (32, 1, 1), TYPES, TEMPLATE, POINTERS, VALUES)
    envs = [_env() for _ in range(4)]
    seen = []

    def work(env):
        bound(env)
        seen.append(driver.calls[-1]["args"] == _want(env))

    threads = [threading.Thread(target=work, args=(env,)) for env in envs]
    for t in threads:
        t.start()
        t.join()
    assert seen == [True] * 4


@pytest.mark.parametrize("pointers", [((1, 5),), ((1, 5), (2, 9))], ids=["one", "two"])
def test_bound_launch_reads_a_dict_of_slots(pointers):
    """A launch sequence records its first run on a dict of slot -> value (sparse slot
    numbers), later runs on a list: a bound launch reads both, one pointer or several (an
    itemgetter of a slice, once tried for the one-pointer case, raised TypeError on a dict and
    broke the recording of fusions that read no tensor on the GPU)."""
    types = ("i32", "ptr", "ptr")[: 1 + len(pointers)]
    driver = _FakeDriver(types)
    template = (3, *[None] * len(pointers))
    launch = _kernel(driver).bind((1, 1, 1), (1, 1, 1), types, template, pointers, ())
    slots = {5: torch.randn(2), 9: torch.randn(3)}
    launch(slots)
    want = [3, *[slots[s].data_ptr() for _, s in pointers]]
    assert driver.calls[-1]["args"] == want
    env = [None] * 10
    env[5], env[9] = slots[5], slots[9]
    launch(env)
    assert driver.calls[-1]["args"] == want


def _sequence(kernel: LoadedKernel):
    """A launch sequence of one kernel step with two bound launches of `kernel`: one of
    pointers only, one reading a scalar too."""
    from types import SimpleNamespace

    from fusion_cache.runtime.sequence import KernelStep, LaunchSequence

    pointers_only = kernel.bind((2, 1, 1), (32, 1, 1), TYPES, (*TEMPLATE[:4], 1.5, *TEMPLATE[5:]),
                                POINTERS, ())  # fmt: skip
    with_values = kernel.bind((1, 1, 1), (32, 1, 1), TYPES, TEMPLATE, POINTERS, VALUES)
    plan = SimpleNamespace(device=torch.device("cpu"))
    step = KernelStep((), (), (pointers_only, with_values), plan, None)
    fd = SimpleNamespace(_cache=SimpleNamespace(counters={"kernel_launches": 0}), _fid=0)
    return LaunchSequence(fd, 5, 5, [step], ())


def test_a_sequence_launches_inline_on_its_thread_and_stream(monkeypatch):
    """Note [Inline launches]: once every launch ran checked on the current stream, the
    sequence fills and calls its pointer-only launches itself; a new stream runs them checked
    again (each config takes it), another thread through the unbound route; the driver sees
    the same arguments and stream each time."""
    driver = _FakeDriver(TYPES)
    streams = [STREAM]
    seq = _sequence(_kernel(driver, streams))
    checked = []
    original = BoundLaunch.__call__
    monkeypatch.setattr(BoundLaunch, "__call__", lambda self, env: (checked.append(1),
                                                                    original(self, env))[1])

    def run(stream: int) -> int:
        streams[0] = stream
        checked.clear()
        env = _env()
        seq.run(env)
        first, second = driver.calls[-2:]
        want = _want(env)
        assert second["args"] == want and first["args"] == [*want[:4], 1.5, *want[5:]]
        assert first["stream"] == second["stream"] == stream
        return len(checked)

    assert run(STREAM) == 2  # the first replay: both checked
    assert run(STREAM) == 1  # then only the one reading a scalar
    assert run(0x9000) == 2  # a new stream: checked, each config takes it
    assert run(0x9000) == 1
    assert run(STREAM) == 2
    seen = []
    thread = threading.Thread(target=lambda: seen.append(run(STREAM)))
    thread.start()
    thread.join()
    assert seen == [2]  # another thread: checked, through the unbound route
    assert run(STREAM) == 1


def test_an_inline_launch_that_fails_raises_naming_the_kernel():
    driver = _FakeDriver(TYPES)
    seq = _sequence(_kernel(driver))
    seq.run(_env())  # checked: the stream is now every launch's
    driver.results = [1]  # CUDA_ERROR_INVALID_VALUE for the next launch, an inline one
    with pytest.raises(LaunchError, match="fake_kernel"):
        seq.run(_env())


def _straight_sequence(kernel: LoadedKernel, monkeypatch, old: bool):
    """Two kernel steps of pointer-only bound launches: the first makes slot 5 from slot 1 (one
    launch), the second slot 6 from slots 0 and 5 (two launches); both outputs returned."""
    from types import SimpleNamespace

    from fusion_cache.runtime.sequence import KernelStep, LaunchSequence

    monkeypatch.setenv("FUSION_CACHE_OLD_HOST_PATH", "1" if old else "0")
    types = ("ptr", "ptr", "i64")
    plan = SimpleNamespace(device=torch.device("cpu"))

    def bind(grid, pointers, size):
        return kernel.bind(grid, (32, 1, 1), types, (None, None, size), pointers, ())

    first = KernelStep(((5, (4,), (1,), torch.float32),), (), (bind((1, 1, 1), ((0, 1), (1, 5)),
                                                                     4),), plan, None)  # fmt: skip
    second = KernelStep(((6, (2, 3), (3, 1), torch.float64),), (),
                        (bind((2, 1, 1), ((0, 0), (1, 6)), 6),
                         bind((3, 1, 1), ((0, 5), (1, 6)), 7)), plan, None)  # fmt: skip
    fd = SimpleNamespace(_cache=SimpleNamespace(counters={"kernel_launches": 0}), _fid=0)
    return LaunchSequence(fd, 5, 7, [first, second], (5, 6))


def test_straight_runs_launch_what_the_checked_route_launches(monkeypatch):
    """Note [Straight runs]: kernel steps replayed as closures allocate their outputs and make
    the same launches, with the same arguments and stream, as the old path's steps."""
    seen = {}
    for old in (True, False):
        driver = _FakeDriver(("ptr", "ptr", "i64"))
        seq = _straight_sequence(_kernel(driver), monkeypatch, old)
        runs = []
        for _ in range(3):  # the first checked, then inline
            env = _env()
            outs = seq.run(env)
            assert outs[0].shape == (4,) and outs[1].stride() == (3, 1)
            assert outs[1].dtype == torch.float64
            ptrs = {env[0].data_ptr(): "in0", env[1].data_ptr(): "in1",
                    outs[0].data_ptr(): "out5", outs[1].data_ptr(): "out6"}  # fmt: skip
            runs.append([(c["grid"], c["stream"], [ptrs.get(a, a) for a in c["args"]])
                         for c in driver.calls[-3:]])  # fmt: skip
        seen[old] = runs
        assert (getattr(seq._inline_runs[0][0], "__name__", "") == "run_one") is not old
    assert seen[True] == seen[False]
    assert seen[False][2] == [((1, 1, 1), STREAM, ["in1", "out5", 4]),
                              ((2, 1, 1), STREAM, ["in0", "out6", 6]),
                              ((3, 1, 1), STREAM, ["out5", "out6", 7])]  # fmt: skip


def test_a_straight_launch_that_fails_raises_naming_the_kernel(monkeypatch):
    driver = _FakeDriver(("ptr", "ptr", "i64"))
    seq = _straight_sequence(_kernel(driver), monkeypatch, False)
    seq.run(_env())  # checked: the stream is now every launch's
    driver.results = [0, 1]  # the second launch fails: CUDA_ERROR_INVALID_VALUE
    with pytest.raises(LaunchError, match="fake_kernel"):
        seq.run(_env())


def test_launches_off_their_binding_thread_are_counted():
    """unbound_launches (benchmarks count it a step): a bound launch called on another thread
    takes the unbound route and counts; on its own thread it does not."""
    driver = _FakeDriver(TYPES)
    launch = _kernel(driver).bind((1, 1, 1), (32, 1, 1), TYPES, TEMPLATE, POINTERS, VALUES)
    before = launch_module.unbound_launches()
    launch(_env())
    assert launch_module.unbound_launches() == before
    thread = threading.Thread(target=lambda: launch(_env()))
    thread.start()
    thread.join()
    assert launch_module.unbound_launches() == before + 1
    assert len(driver.calls) == 2
