"""Shared fixtures: a fresh store and a fresh fusion cache per test, and the gpu marker."""

import pytest


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


HAS_GPU = _has_gpu()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="no CUDA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def fresh_store(tmp_path, monkeypatch):
    """Every test gets its own cache directory, and fallback to the reference is off. So
    does torch: the backend's graphs go to its AOTAutograd cache (Note [AOT cache])."""
    monkeypatch.setenv("FUSION_CACHE_DIR", str(tmp_path / "fusion_cache"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "torchinductor"))
    monkeypatch.delenv("FUSION_CACHE_DB_URL", raising=False)
    monkeypatch.setenv("FUSION_CACHE_DISABLE_FALLBACK", "1")
    try:
        from fusion_cache import FusionCache

        FusionCache.reset()
    except ImportError:
        pass
    yield tmp_path / "fusion_cache"


@pytest.fixture
def fresh_dynamo(monkeypatch):
    """The torch.compile backend registered, dynamo's caches and the backend's reports
    emptied, and the knobs that change what it fuses or caches unset (the tests set theirs)."""
    import torch._dynamo

    from fusion_cache.frontends import dynamo_backend, register_backend

    register_backend()
    for knob in ("DUMP", "SINGLE_NODE", "AOT_CACHE", "AOT_FORM"):
        monkeypatch.delenv(f"FUSION_CACHE_{knob}", raising=False)
    torch._dynamo.reset()
    dynamo_backend.reset_reports()
    yield
    torch._dynamo.reset()
