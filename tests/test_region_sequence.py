"""Launch sequences (Note [Launch sequence]) and their guard, on the CPU.

The plans are made for the h100 profile and launched by stub kernels (benchmarks.host_region's
stub_launches), so the CPU sees the GPU path's wiring. The oracle is execute()'s own path:
a sequence, recorded and replayed, must launch the same kernels with the same grids and
scalars, and pointers that name the same buffers (inputs by position, every other buffer by
the order it first appears; allocations are kept alive so no address is reused).
"""
from __future__ import annotations

import pytest
import torch

from benchmarks.host_region import StubKernel, count_python_calls, stub_launches
from fusion_cache import DataType, FusionDefinition
from fusion_cache.runtime import sequence as seq_mod
from fusion_cache.runtime.sequence import (
    ExecuteStep,
    Guard,
    KernelStep,
    TensorStep,
    sequence_for,
)
from tests import segment_patterns as sp


def _bias_gelu() -> FusionDefinition:
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        b = fd.define_tensor(shape=[-1], dtype=DataType.Float)
        y = fd.ops.add(x, fd.ops.broadcast(b, [True, False]))
        fd.add_output(fd.ops.mul(y, fd.ops.sigmoid(y)))
        fd.add_output(y)
    return fd


def _scaled_by_cpu_scalar() -> FusionDefinition:
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        s = fd.define_tensor(shape=[], dtype=DataType.Float, is_cpu=True)
        fd.add_output(fd.ops.mul(x, s))
    return fd


def _batch_norm_training() -> FusionDefinition:
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1, -1, -1], dtype=DataType.Float)
        w, b, rm, rv = (fd.define_tensor(shape=[-1], dtype=DataType.Float) for _ in range(4))
        out, mean, invstd = fd.ops.batch_norm(x, w, b, rm, rv, 0.1, 1e-5, True)
        fd.add_output(out)
        fd.add_output(mean)
        fd.add_output(invstd)
    return fd


def _inputs(name: str) -> tuple[FusionDefinition, list]:
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    if name == "pointwise":
        return _bias_gelu(), [r(8, 64), r(64)]
    if name == "cpu_scalar":
        return _scaled_by_cpu_scalar(), [r(8, 64), torch.tensor(1.5)]
    if name == "batch_norm_aliases":
        return _batch_norm_training(), [r(4, 3, 5, 5), r(3), r(3), r(3), r(3).abs() + 0.5]
    if name == "layer_norm_backward":
        return sp.layer_norm_backward(torch.float32), list(
            sp.layer_norm_backward_inputs(64, 256, torch.float32))
    if name == "segmented_chain":
        return sp.chain_with_boundaries(3), [r(16, 32)]
    if name == "aten_linear_gelu":
        return _linear_gelu(), [r(8, 16), r(32, 16), r(32)]
    raise KeyError(name)


def _linear_gelu() -> FusionDefinition:
    """An ATen segment (the GEMM) between generated ones (Note [ATen segments])."""
    with FusionDefinition() as fd:
        x, w, b = (fd.define_tensor(shape=[-1] * n, dtype=DataType.Float) for n in (2, 2, 1))
        y = fd.ops.linear(fd.ops.mul(x, 2.0), w, b)
        fd.add_output(fd.ops.mul(y, fd.ops.sigmoid(y)))
    return fd


HAS_ATEN = hasattr(FusionDefinition().ops, "linear")


CASES = ["pointwise", "cpu_scalar", "batch_norm_aliases", "layer_norm_backward",
         "segmented_chain", "aten_linear_gelu"]  # fmt: skip


@pytest.fixture
def kept_allocations(monkeypatch):
    """torch.empty and empty_strided keep what they allocate: no address is reused."""
    kept, empty, strided = [], torch.empty, torch.empty_strided

    def keep(fn):
        def alloc(*a, **k):
            kept.append(fn(*a, **k))
            return kept[-1]

        return alloc

    monkeypatch.setattr(torch, "empty", keep(empty))
    monkeypatch.setattr(torch, "empty_strided", keep(strided))
    monkeypatch.setattr(seq_mod, "_fast_empty", lambda device: None)
    return kept


def _labelled(log: list, inputs: list, outs: list) -> tuple[list, list]:
    """Launch records and outputs with pointers named: inN for inputs, bufN by first use."""
    names = {t.data_ptr(): f"in{i}" for i, t in enumerate(inputs) if isinstance(t, torch.Tensor)}

    def name(ptr: int) -> str:
        if ptr not in names:
            names[ptr] = f"buf{sum(n.startswith('buf') for n in names.values())}"
        return names[ptr]

    launches = []
    for kernel, grid, block, smem, coop, dep, types, args in log:
        named = [name(a) if t == "ptr" else a for a, t in zip(args, types)]
        launches.append((kernel, grid, block, smem, coop, dep, named))
    return launches, [name(o.data_ptr()) for o in outs]


@pytest.mark.parametrize("name", CASES)
def test_replay_launches_what_execute_launches(name, kept_allocations):
    if name.startswith("aten") and not HAS_ATEN:
        pytest.skip("this build's frontend has no ATen ops")
    fd, inputs = _inputs(name)
    log: list = []
    with stub_launches(log=log):
        want_outs = fd.execute(inputs)
        want = _labelled(log, inputs, want_outs)
        assert want[0], "execute launched nothing"
        log.clear()
        seq, outs = sequence_for(fd, inputs)
        assert _labelled(log, inputs, outs) == want
        log.clear()
        replayed = seq.run(inputs)
        assert _labelled(log, inputs, replayed) == want
    assert not any(isinstance(s, ExecuteStep) for s in seq.steps), seq.describe()
    assert [tuple(o.shape) for o in replayed] == [tuple(o.shape) for o in want_outs]
    assert [o.dtype for o in replayed] == [o.dtype for o in want_outs]
    if name == "cpu_scalar":
        assert any(isinstance(s, TensorStep) for s in seq.steps)
    if name == "segmented_chain":
        assert seq.kernel_steps == 3 and any(seq.drops), seq.describe()
    if name == "aten_linear_gelu":  # the GEMM's prepared call, between two kernels
        assert [type(s).__name__ for s in seq.steps] == ["KernelStep", "AtenStep", "KernelStep"]
        torch.testing.assert_close(replayed[0].shape, want_outs[0].shape)


def test_replay_without_kept_buffers_drops_only_dead_slots():
    """Intermediates die as soon as no later step reads them; a slot dropped early would be
    None when read, so replaying the segmented chain with real frees checks the drops."""
    fd, inputs = _inputs("segmented_chain")
    with stub_launches():
        seq, _ = sequence_for(fd, inputs)
        for _ in range(3):
            (out,) = seq.run(inputs)
            assert out.shape == inputs[0].shape
    dropped = {s for d in seq.drops for s in d}
    assert dropped and not dropped & set(seq.outputs) and min(dropped) >= seq.n_inputs


def test_cpu_inputs_replay_through_execute():
    fd, inputs = _inputs("pointwise")
    seq, outs = sequence_for(fd, inputs)
    assert [type(s) for s in seq.steps] == [ExecuteStep]
    assert "execute of fusion" in seq.describe() and "no CUDA tensor" in seq.steps[0].why
    x, b = torch.randn(8, 64), torch.randn(64)
    got = seq.run([x, b])
    y = x + b
    torch.testing.assert_close(got[1], y)
    torch.testing.assert_close(got[0], y * torch.sigmoid(y))


def test_guard_takes_the_same_signature_only():
    x, b = torch.randn(8, 64), torch.randn(64)
    guard = Guard([x, b, 3, 0.5])
    assert guard.matches([torch.randn(8, 64), torch.randn(64), 3, 2.5])  # floats: any value
    assert not guard.matches([torch.randn(8, 65), b, 3, 0.5])  # shape
    assert not guard.matches([torch.randn(64, 8).t(), b, 3, 0.5])  # strides
    assert not guard.matches([x.double(), b, 3, 0.5])  # dtype
    assert not guard.matches([x, b, 4, 0.5])  # an int may size a tensor
    assert not guard.matches([x, b, 3, 1])  # a scalar's type
    shifted = torch.randn(8 * 64 + 1)[1:].view(8, 64)  # 4-byte aligned, same shape and strides
    assert not guard.matches([shifted, b, 3, 0.5])
    # recorded at 4 bytes, a 16-byte aligned input replays the same kernels correctly
    assert Guard([shifted, b]).matches([x, b])


@pytest.mark.parametrize("torchs", [True, False], ids=["tensor_guard", "python_check"])
def test_guard_of_a_tensor_given_twice(torchs, monkeypatch):
    """A region given one tensor at two positions (a view made once for both, Note [Views as
    aliases]) replays for later calls that do the same, with torch's tensor guard (which
    refuses aliased tensors) or without; a call with two tensors there does not."""
    if not torchs:
        monkeypatch.setattr(seq_mod, "_tensor_guard", lambda tensors: None)
    x, r = torch.randn(8, 64), torch.randn(1, 64)
    guard = Guard([x, r, r])
    assert guard.same == ((2, 1),)
    fresh = torch.randn(1, 64)
    assert guard.matches([torch.randn(8, 64), fresh, fresh])
    assert not guard.matches([x, r, torch.randn(1, 64)])  # no longer one tensor
    other = torch.randn(64, 1).t()
    assert not guard.matches([x, other, other])  # the shared tensor's strides
    assert Guard([x, r, x, 2]).matches([x, r, x, 2])


def test_guard_without_torchs_tensor_guard(monkeypatch):
    monkeypatch.setattr(seq_mod, "_tensor_guard", lambda tensors: None)
    x = torch.randn(4, 6)
    guard = Guard([x])
    assert guard.check is None
    assert guard.matches([torch.randn(4, 6)]) and not guard.matches([torch.randn(6, 4).t()])
    assert not guard.matches([x.half()])


def test_replay_is_a_few_python_calls():
    """The replay of a one-kernel plan: the guard, the sequence, its step and the launch."""
    fd, inputs = _inputs("pointwise")
    with stub_launches():
        seq, _ = sequence_for(fd, inputs)
        guard = Guard(inputs)
        (step,) = seq.steps
        assert isinstance(step, KernelStep) and isinstance(step.launches[0].kernel, StubKernel)

        def call():
            if guard.matches(inputs):
                seq.run(inputs)

        assert count_python_calls(call) <= 6  # matches, run, step.run, launch, + a listcomp


def test_scratch_is_the_plans_own_across_replays():
    """Note [Scratch per stream]: a split reduction's partials live with its plan; replays on
    one stream pass the same buffers, and allocate only the outputs."""
    from benchmarks.host_region import CASES as REGION_CASES
    from benchmarks.host_region import region_of

    case = next(c for c in REGION_CASES if c.name == "layer_norm_backward")
    log: list = []
    with stub_launches(log=log):
        region, args, _ = region_of(case, "cpu")
        region(*args)
        (seq,) = region.sequences
        (step,) = [s for s in seq.steps if isinstance(s, KernelStep)]
        assert step.scratch, "the case must plan scratch buffers"
        pointers = []
        for _ in range(2):
            log.clear()
            outs = region(*args)
            (launch,) = log
            pointers.append({a for a, t in zip(launch[7], launch[6]) if t == "ptr"})
        scratch = {t.data_ptr() for t in step.plan.scratch()}
        assert scratch <= pointers[0] and scratch <= pointers[1]
        assert all(o.data_ptr() not in scratch for o in outs)


def _matmul_of_a_permute() -> FusionDefinition:
    """An ATen segment alone, its second operand a view (as_strided) of its input."""
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.matmul(a, fd.ops.permute(a, [1, 0])))
    return fd


def _attention_with_lse() -> FusionDefinition:
    """An op of several outputs, two returned (the replay picks them from its call)."""
    with FusionDefinition() as fd:
        q, k, v = (fd.define_tensor(shape=[-1] * 4, dtype=DataType.Float) for _ in range(3))
        out, lse, _, _ = fd.ops.sdpfa_fwd(q, k, v, None, True, None)
        fd.add_output(out)
        fd.add_output(lse)
    return fd


@pytest.mark.skipif(not HAS_ATEN, reason="this build's frontend has no ATen ops")
def test_aten_step_replays_its_call_in_one_python_call():
    """Note [Prepared ATen calls]: a replayed GEMM step is its own frame and the torch call:
    no list of values, no prepared call's frame; the sequence counts its runs."""
    from fusion_cache import FusionCache
    from fusion_cache.runtime.sequence import AtenStep

    a = torch.randn(8, 4)
    fd = _matmul_of_a_permute()
    with stub_launches():
        seq, _ = sequence_for(fd, [a])
        (step,) = seq.steps
        # Note [GEMM entry]: a matmul of two matrices replays as torch.mm
        assert isinstance(step, AtenStep) and step.fn is torch.mm, seq.describe()
        env = [a, *seq.pad]
        assert count_python_calls(lambda: step.run(env)) == 1
        before = FusionCache.get().stats().get("aten_runs", 0)
        (out,) = seq.run([a])
        assert FusionCache.get().stats()["aten_runs"] - before == 1
    torch.testing.assert_close(out, a @ a.t())


@pytest.mark.skipif(not HAS_ATEN, reason="this build's frontend has no ATen ops")
def test_aten_step_given_other_strides_takes_the_prepared_path():
    """A slot read through a view whose strides are not the prepared ones (another segment's
    result, which no guard pins) is not viewed with the recorded strides: the prepared
    call's own path (it interprets) runs instead."""
    a = torch.randn(8, 4)
    with stub_launches():
        seq, _ = sequence_for(_matmul_of_a_permute(), [a])
        (step,) = seq.steps
        # the step as made, its check kept: its slot here is an input, which the sequence
        # pins (Note [Operands laid out by their kernels]), standing for one it does not
        step = type(step)(step.call, step.reads, step.writes)
        other = torch.randn(4, 8).t()  # the same sizes, column-major
        env = [other, *seq.pad]
        step.run(env)
    torch.testing.assert_close(env[step.writes[0]], other @ other.t())


@pytest.mark.skipif(not HAS_ATEN, reason="this build's frontend has no ATen ops")
@pytest.mark.parametrize("old", [False, True], ids=["new", "old_host_path"])
def test_gemm_entry_is_mm_for_matrices_only(old, monkeypatch):
    """Note [GEMM entry]: torch.mm where both operands are 2-D (the same result to the bit),
    torch.matmul for a batched operand, and always on the old path."""
    from fusion_cache.runtime.sequence import AtenStep

    monkeypatch.setenv("FUSION_CACHE_OLD_HOST_PATH", "1" if old else "0")
    with FusionDefinition() as batched:
        x = batched.define_tensor(shape=[-1, -1, -1], dtype=DataType.Float)
        w = batched.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        batched.add_output(batched.ops.matmul(x, w))
    a, x, w = torch.randn(8, 4), torch.randn(2, 3, 4), torch.randn(4, 5)
    with stub_launches():
        (step,), got = _steps(_matmul_of_a_permute(), [a])
        assert isinstance(step, AtenStep) and step.fn is (torch.matmul if old else torch.mm)
        torch.testing.assert_close(got[0], a @ a.t(), rtol=0, atol=0)
        (step,), got = _steps(batched, [x, w])
        assert step.fn is torch.matmul
        torch.testing.assert_close(got[0], x @ w, rtol=0, atol=0)


def _steps(fd: FusionDefinition, values: list) -> tuple:
    seq, _ = sequence_for(fd, values)
    return seq.steps, seq.run(values)


@pytest.mark.skipif(not HAS_ATEN, reason="this build's frontend has no ATen ops")
def test_aten_step_straight_run_makes_the_same_call():
    """Note [Straight runs]: the GEMM step's closure views its operand as `run` does, and
    takes the prepared path for strides it was not prepared for."""
    a = torch.randn(8, 4)
    with stub_launches():
        seq, _ = sequence_for(_matmul_of_a_permute(), [a])
        (step,) = seq.steps
        # its check kept, as in test_aten_step_given_other_strides_takes_the_prepared_path
        step = type(step)(step.call, step.reads, step.writes)
        run = step.straight()
        assert run is not step.run
        env = [a, *seq.pad]
        run(env)
        torch.testing.assert_close(env[step.writes[0]], a @ a.t(), rtol=0, atol=0)
        other = torch.randn(4, 8).t()
        env = [other, *seq.pad]
        run(env)
        torch.testing.assert_close(env[step.writes[0]], other @ other.t())
        (out,) = seq.run([a])  # no bound launch: the checked route, its GEMM step straight
        torch.testing.assert_close(out, a @ a.t(), rtol=0, atol=0)


@pytest.mark.skipif(not HAS_ATEN, reason="this build's frontend has no ATen ops")
def test_linear_step_with_a_bias_runs_straight():
    """Note [Straight runs]: a GEMM with a bias (GPT-2's linear layers) reads its three operands
    through getters made once, and replays the same call."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        w = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        b = fd.define_tensor(shape=[-1], dtype=DataType.Float)
        fd.add_output(fd.ops.linear(x, w, b))
    x, w, b = torch.randn(8, 4), torch.randn(5, 4), torch.randn(5)
    with stub_launches():
        seq, _ = sequence_for(fd, [x, w, b])
        (step,) = seq.steps
        run = step.straight()
        assert run is not step.run and len(step.args) == 3, seq.describe()
        env = [x, w, b, *seq.pad]
        run(env)
    want = torch.nn.functional.linear(x, w, b)
    torch.testing.assert_close(env[step.writes[0]], want, rtol=0, atol=0)


@pytest.mark.skipif(not HAS_ATEN, reason="this build's frontend has no ATen ops")
def test_aten_step_of_several_outputs_replays_execute():
    g = torch.Generator().manual_seed(3)
    fd = _attention_with_lse()
    q, k, v = (torch.randn(2, 2, 8, 16, generator=g) for _ in range(3))
    with stub_launches():
        want = fd.execute([q, k, v])
        seq, first = sequence_for(fd, [q, k, v])
        (step,) = seq.steps
        assert step.fn is not None and step.picks == (0, 1), seq.describe()
        q2, k2, v2 = (torch.randn(2, 2, 8, 16, generator=g) for _ in range(3))
        again = seq.run([q2, k2, v2])
        want2 = fd.execute([q2, k2, v2])
    assert len(again) == 2
    for got, ref in zip([*first, *again], [*want, *want2]):
        assert torch.equal(got, ref)
    ref = torch.nn.functional.scaled_dot_product_attention(q2, k2, v2, is_causal=True)
    torch.testing.assert_close(again[0], ref)


def test_kernel_only_intermediates_share_an_arena():
    """Note [Shared intermediates]: a chain of five segments hands four intermediates along;
    the replay carves them from one arena, allocated once, where two alive at the same step
    never meet and the first and third (never alive together) share an address; replays
    run with the arena dropped after its last carve."""
    fd, inputs = sp.chain_with_boundaries(5), [torch.randn(16, 32)]
    log: list = []
    with stub_launches(log=log):
        seq, _ = sequence_for(fd, inputs)
        kernels = [s for s in seq.steps if isinstance(s, KernelStep)]
        assert [len(s.arenas) for s in kernels] == [1, 0, 0, 0, 0]
        assert [len(s.carves) for s in kernels] == [1, 1, 1, 1, 0]
        assert [len(s.fresh) for s in kernels] == [0, 0, 0, 0, 1]
        ((arena, size, dtype),) = kernels[0].arenas
        assert size * dtype.itemsize == 2 * 16 * 32 * 4  # two blocks of 16x32 f32
        assert arena in {s for d in seq.drops for s in d}
        for _ in range(2):
            log.clear()
            (out,) = seq.run(inputs)
            assert out.shape == inputs[0].shape
            ptrs = [[a for a, t in zip(args, types) if t == "ptr"] for *_, types, args in log]
            # launch k reads what launch k-1 wrote; each writes elsewhere than it reads
            assert all(p[0] != p[1] for p in ptrs), ptrs
            assert all(ptrs[k][0] == ptrs[k - 1][1] for k in range(1, 5)), ptrs
            assert ptrs[0][1] == ptrs[2][1] and ptrs[1][1] == ptrs[3][1]


def test_large_intermediates_are_allocated_alone():
    """An intermediate over ARENA_BLOCK_BYTES is allocated and freed as the allocator would:
    an arena would hold it past its last read (a chain of four 64 MiB values peaked at three
    alive on the GPU). The replay's results are the recorded run's."""
    fd = sp.chain_with_boundaries(4)
    x = torch.randn(2048, 2049)  # 16 MiB and a row: just over the bound
    assert x.numel() * 4 > seq_mod.ARENA_BLOCK_BYTES
    with stub_launches():
        seq, _ = sequence_for(fd, [x])
        kernels = [s for s in seq.steps if isinstance(s, KernelStep)]
        assert all(not s.arenas and not s.carves for s in kernels), seq.describe()
        assert [len(s.fresh) for s in kernels] == [1, 1, 1, 1]
        (out,) = seq.run([x])
        assert out.shape == x.shape


def test_arenas_are_cut_at_their_bound():
    """Blocks in step order are cut into runs whose arena stays within ARENA_BYTES; every
    block lands in one run, in order."""
    mib = 1 << 20
    blocks = [(i, i, 11, 12 * mib, None) for i in range(12)]  # each alive to the end
    chunks = seq_mod._arena_chunks(blocks)
    assert [b for c in chunks for b in c] == blocks and [len(c) for c in chunks] == [5, 5, 2]
    assert all(seq_mod._layout(c)[1] <= seq_mod.ARENA_BYTES for c in chunks)
    small = [(i, i, i + 1, 12 * mib, None) for i in range(12)]  # two alive at a step
    assert seq_mod._arena_chunks(small) == [small]


def test_arena_layout_keeps_live_blocks_apart():
    """Blocks alive at a common step never overlap, offsets are aligned, the arena holds
    them all; blocks that never meet may share bytes."""
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        blocks = []
        for i in range(int(torch.randint(2, 12, (), generator=g))):
            first = int(torch.randint(0, 10, (), generator=g))
            last = first + int(torch.randint(0, 5, (), generator=g))
            blocks.append((i, first, last, int(torch.randint(1, 5000, (), generator=g)), None))
        offsets, total = seq_mod._layout(blocks)
        assert all(o % seq_mod.ARENA_ALIGN == 0 for o in offsets)
        for (_, f1, l1, n1, _), o1 in zip(blocks, offsets):
            assert o1 + n1 <= total
            for (_, f2, l2, n2, _), o2 in zip(blocks, offsets):
                if (f1, l1, n1, o1) != (f2, l2, n2, o2) and f1 <= l2 and f2 <= l1:
                    assert o1 + n1 <= o2 or o2 + n2 <= o1


def test_small_outputs_of_a_step_share_one_allocation(monkeypatch):
    """Note [Packed small outputs]: with the switch, a kernel step's two small outputs are
    carved from one allocation, 256 bytes apart, and its launch writes where the returned
    outputs are; without it each is allocated alone."""
    fd = _bias_gelu()
    inputs = [torch.randn(4, 8), torch.randn(8)]
    log: list = []  # the stub kernels of the plan, made once, write here
    for switch in ("0", "1"):
        monkeypatch.setenv("FUSION_CACHE_PACKED_OUTPUTS", switch)
        with stub_launches(log=log):
            seq, _ = sequence_for(fd, inputs)
            (step,) = [s for s in seq.steps if isinstance(s, KernelStep)]
            for _ in range(2):
                log.clear()
                a, b = seq.run(inputs)
                assert a.shape == b.shape == (4, 8) and a.stride() == b.stride() == (8, 1)
                ((*_, types, args),) = log
                written = [p for p, t in zip(args, types) if t == "ptr"][-2:]
                assert sorted(written) == sorted([a.data_ptr(), b.data_ptr()])
        shared = a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        if switch == "1":
            assert not step.fresh and len(step.carves) == 2 and len(step.arenas) == 1
            assert shared and abs(a.data_ptr() - b.data_ptr()) == seq_mod.ARENA_ALIGN
            assert step.arenas[0][0] in {s for d in seq.drops for s in d}
        else:
            assert len(step.fresh) == 2 and not step.carves and not shared
