"""Named device profiles (no GPU needed)."""

import dataclasses

import pytest

from schedulers.device import (
    KNOWN_PROFILES,
    DeviceProfile,
    current_profile,
    profile_by_name,
    resolve_target,
)


def test_h100_datasheet_numbers():
    p = profile_by_name("h100")
    assert (p.arch, p.sm_count, p.warp_size) == (90, 132, 32)
    assert p.smem_per_sm == 228 * 1024 and p.smem_per_block_optin == 227 * 1024
    assert p.smem_per_block == 48 * 1024
    assert p.l2_bytes == 50 * 1024 * 1024
    assert (p.regs_per_sm, p.max_threads_per_sm, p.max_threads_per_block) == (65536, 2048, 1024)
    assert p.mem_bandwidth_gbs == 3352.0 and p.supports_clusters
    assert p.sm_arch == "sm_90" and p.compute_capability == (9, 0)


def test_other_named_profiles():
    a100 = profile_by_name("a100")
    assert (a100.arch, a100.sm_count, a100.supports_clusters) == (80, 108, False)
    assert a100.smem_per_sm == 164 * 1024 and a100.smem_per_block_optin == 163 * 1024
    assert a100.l2_bytes == 40 * 1024 * 1024
    h200 = profile_by_name("h200")
    assert (h200.arch, h200.sm_count, h200.mem_bandwidth_gbs) == (90, 132, 4800.0)
    assert h200.l2_bytes == 60 * 1024 * 1024
    # Same SMs as the H100: per-SM and per-block limits are identical (how the SMs fall
    # into GPCs is each chip's own; only the lent H100's is known)
    ignore = {"name", "mem_bandwidth_gbs", "mem_bytes", "l2_bytes", "gpc_sms"}
    for field in dataclasses.fields(DeviceProfile):
        if field.name not in ignore:
            assert getattr(h200, field.name) == getattr(profile_by_name("h100"), field.name)
    assert {"a100", "h100", "h200", "l4", "a10"} <= set(KNOWN_PROFILES)


def test_profiles_are_consistent():
    for name, p in KNOWN_PROFILES.items():
        assert p.name == name
        assert p.smem_per_block <= p.smem_per_block_optin < p.smem_per_sm
        assert p.max_threads_per_block <= p.max_threads_per_sm
        assert p.regs_per_block <= p.regs_per_sm
        assert p.supports_clusters == (p.arch >= 90)


def test_names_are_case_insensitive():
    assert profile_by_name("H100") is profile_by_name(" h100 ")


@pytest.mark.parametrize("bad", ["h300", "sm_90", "", "nvidia h100"])
def test_bad_name_lists_known_names(bad):
    with pytest.raises(ValueError) as info:
        profile_by_name(bad)
    message = str(info.value)
    assert repr(bad) in message
    for name in KNOWN_PROFILES:
        assert name in message


def test_profiles_are_frozen_and_hashable():
    p = profile_by_name("a100")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.sm_count = 1  # type: ignore[misc]
    assert hash(p) == hash(dataclasses.replace(p))


def test_resolve_target():
    h100 = profile_by_name("h100")
    assert resolve_target("h100") is h100
    assert resolve_target(h100) is h100
    custom = dataclasses.replace(h100, name="h100-half", sm_count=66)
    assert resolve_target(custom) is custom
    with pytest.raises(ValueError):
        resolve_target("nope")
    with pytest.raises(TypeError):
        resolve_target(90)  # type: ignore[arg-type]


def test_current_profile_without_gpu_raises_runtime_error():
    from codegen.launch import gpu_available

    if gpu_available():
        assert current_profile().sm_count > 0
        assert resolve_target(None) == current_profile()
    else:
        with pytest.raises(RuntimeError):
            current_profile()
        with pytest.raises(RuntimeError):
            resolve_target(None)


def test_resident_clusters_follow_the_gpcs():
    # Note [One wave of partials]: the H100 profile's GPCs give the driver's counts there
    # (14 clusters of 16 at two blocks an SM, 7 at one, 15 of 8, 62 of 4); a profile
    # without GPCs shares the SMs' blocks out
    from schedulers.device import KNOWN_PROFILES

    h100 = KNOWN_PROFILES["h100"]
    assert sum(h100.gpc_sms) == h100.sm_count
    counts = [h100.resident_clusters(c, b) for c, b in ((16, 2), (16, 1), (8, 1), (4, 2), (16, 4))]
    assert counts == [14, 7, 15, 62, 28]
    a100 = KNOWN_PROFILES["a100"]
    assert a100.resident_clusters(1, 2) == 216
