"""The dump knobs (fusion_cache/frontend/options.py): an unknown value warns once, naming
the valid ones, and turns nothing on."""
from __future__ import annotations

import warnings

import pytest

from fusion_cache.frontend import options


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(options, "_warned", set())
    for var in options.DUMP_VARS:
        monkeypatch.delenv(var, raising=False)


def test_unknown_dump_values_warn_once_naming_the_valid_ones(monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_DUMP", "fusion_ir, cuda_kernels,nonsense")
    with pytest.warns(UserWarning) as caught:
        assert options.dump_options() == {"fusion_ir"}
    (warning,) = caught
    text = str(warning.message)
    assert "FUSION_CACHE_DUMP" in text and "cuda_kernels, nonsense" in text
    assert "cuda_kernel" in text.split("valid:")[1] and "python_definition" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second look says nothing more
        assert options.dump_options() == {"fusion_ir"}
        assert not options.dump_enabled("nonsense")


def test_alias_variables_are_named_in_the_warning(monkeypatch):
    monkeypatch.setenv("NVFUSER_DUMP", "segment")
    with pytest.warns(UserWarning, match="NVFUSER_DUMP: unknown option segment ignored"):
        assert options.dump_options() == frozenset()


def test_known_values_are_quiet(monkeypatch):
    monkeypatch.setenv("PYTORCH_NVFUSER_DUMP", ",".join(sorted(options.DUMP_OPTIONS)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert options.dump_options() == options.DUMP_OPTIONS
