"""The route in for `import nvfuser` clients (fusion_cache/frontend/nvfuser_compat.py): the
modules Thunder's nvFuser executor imports resolve to fusion-cache, with nvFuser's API
level as version, and a fusion defined through them runs."""
from __future__ import annotations

import sys

import pytest
import torch

import fusion_cache
from fusion_cache.frontend.nvfuser_compat import NVFUSER_API_LEVEL, NvfuserVersion

_KEYS = ("nvfuser", "nvfuser._C", "nvfuser.pytorch_utils", "nvfuser.nvfuser_version",
         "nvfuser_direct")  # fmt: skip


@pytest.fixture
def nvfuser_route():
    """install_as_nvfuser() for one test; sys.modules as it was afterwards."""
    saved = {k: sys.modules[k] for k in _KEYS if k in sys.modules}
    for k in _KEYS:
        sys.modules.pop(k, None)
    yield fusion_cache.install_as_nvfuser()
    for k in _KEYS:
        sys.modules.pop(k, None)
    sys.modules.update(saved)


def test_import_nvfuser_and_submodules_resolve_here(nvfuser_route):
    import nvfuser
    import nvfuser._C
    import nvfuser.pytorch_utils
    from nvfuser import DataType, FusionCache, FusionDefinition, compute_tensor_descriptor
    from nvfuser.pytorch_utils import python_scalar_to_nvfuser_dtype, torch_dtype_to_nvfuser_dtype

    assert nvfuser is nvfuser_route
    assert FusionDefinition is fusion_cache.FusionDefinition
    assert DataType is fusion_cache.DataType and FusionCache is fusion_cache.FusionCache
    assert compute_tensor_descriptor is fusion_cache.compute_tensor_descriptor
    assert nvfuser._C.Scalar is fusion_cache.Scalar and nvfuser._C.Tensor is fusion_cache.Tensor
    assert torch_dtype_to_nvfuser_dtype(torch.bfloat16) is DataType.BFloat16
    assert torch_dtype_to_nvfuser_dtype(torch.int32) is DataType.Int32
    assert torch_dtype_to_nvfuser_dtype(float) is DataType.Double
    assert python_scalar_to_nvfuser_dtype(True) is DataType.Bool
    assert python_scalar_to_nvfuser_dtype(3) is DataType.Int


def test_version_reports_the_api_level_and_ours_stays_ours(nvfuser_route):
    import nvfuser

    v = nvfuser.version()
    assert v == NVFUSER_API_LEVEL == "0.2.27" and nvfuser.__version__ == v
    assert fusion_cache.version() != v  # the project's own version is not the API level
    # compared as a version, as Thunder does: 0.2.23 <= v < 0.2.28 selects the legacy frontend
    assert "0.2.23" <= v < "0.2.28" and v > "0.2.9" and v >= "0.2.27+git1234" and v < "0.10"
    assert NvfuserVersion("1.0") == "1.0.0" and NvfuserVersion("0.2.27") != "0.2.28"


def test_nvfuser_direct_is_hidden(nvfuser_route):
    with pytest.raises(ImportError):
        import nvfuser_direct  # noqa: F401


def test_install_is_idempotent_and_refuses_a_real_nvfuser(nvfuser_route):
    assert fusion_cache.install_as_nvfuser() is nvfuser_route
    import types

    sys.modules["nvfuser"] = types.ModuleType("nvfuser")  # stands for the real package
    with pytest.raises(RuntimeError, match="before anything imports nvfuser"):
        fusion_cache.install_as_nvfuser()


def test_a_fusion_defined_through_nvfuser_runs(nvfuser_route):
    from nvfuser import DataType, FusionDefinition

    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        s = fd.define_scalar(2.0, DataType.Double)
        fd.add_output(fd.ops.mul(fd.ops.exp(t0), s))
    x = torch.randn(3, 5)
    (out,) = fd.execute([x], device=None, save_repro_inputs=False, _enable_options=[],
                        _disable_options=[])  # fmt: skip
    torch.testing.assert_close(out, torch.exp(x) * 2)
