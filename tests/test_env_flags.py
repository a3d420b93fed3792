"""Every on/off variable of the project reads the same words (fusion_cache.frontend.options.env_flag)."""
from __future__ import annotations

import pytest

from fusion_cache.frontend.options import env_flag, fallback_disabled
from fusion_cache.frontends.cuda_graphs import cuda_graphs_wanted
from fusion_cache.frontends.recompute import min_cut_under_graphs
from fusion_cache.runtime.sequence import operands_laid_out
from schedulers.scatter import deterministic
from schedulers.tuning import switched_on

OFF = ["0", "false", "False", "OFF", "no", " 0 "]
ON = ["1", "true", "yes", "on", "ON"]


@pytest.mark.parametrize("value", OFF)
def test_off_words_turn_off(value, monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_TEST_FLAG", value)
    assert env_flag("FUSION_CACHE_TEST_FLAG", True) is False


@pytest.mark.parametrize("value", ON)
def test_other_words_turn_on(value, monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_TEST_FLAG", value)
    assert env_flag("FUSION_CACHE_TEST_FLAG", False) is True


@pytest.mark.parametrize("value", ["", "  "])
def test_unset_or_empty_gives_the_default(value, monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_TEST_FLAG", value)
    assert env_flag("FUSION_CACHE_TEST_FLAG", True) is True
    assert env_flag("FUSION_CACHE_TEST_FLAG", False) is False
    monkeypatch.delenv("FUSION_CACHE_TEST_FLAG")
    assert env_flag("FUSION_CACHE_TEST_FLAG", True) is True


# (variable, reader, default): "false" and "off" turned some of these on before they shared
# the reader (FUSION_CACHE_DETERMINISTIC=false asked for the ordered scatter)
READERS = [
    ("FUSION_CACHE_DETERMINISTIC", deterministic, False),
    ("FUSION_CACHE_DISABLE_FALLBACK", fallback_disabled, False),
    ("PYTORCH_NVFUSER_DISABLE_FALLBACK", fallback_disabled, False),
    ("FUSION_CACHE_MIN_CUT", min_cut_under_graphs, True),
    ("FUSION_CACHE_LAID_OUT_OPERANDS", operands_laid_out, True),
    ("FUSION_CACHE_CUDA_GRAPHS", lambda: cuda_graphs_wanted(None, None), False),
    ("FUSION_CACHE_MIN_CUT", lambda: switched_on("MIN_CUT"), False),
    ("FUSION_CACHE_VIEWS_TO_READERS", lambda: switched_on("VIEWS_TO_READERS"), True),
]


@pytest.mark.parametrize(("variable", "reader", "default"), READERS,
                         ids=[f"{v}-{i}" for i, (v, _, _) in enumerate(READERS)])
def test_each_reader_takes_the_shared_words(variable, reader, default, monkeypatch):
    for name in ("FUSION_CACHE_DISABLE_FALLBACK", "PYTORCH_NVFUSER_DISABLE_FALLBACK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(variable, raising=False)
    assert reader() is default
    for word in ("false", "off", "no", "0"):
        monkeypatch.setenv(variable, word)
        assert reader() is False, word
    for word in ("1", "true", "on"):
        monkeypatch.setenv(variable, word)
        assert reader() is True, word
