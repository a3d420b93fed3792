"""Note [Searches apart]: the regions' segmentation searches run in forked children find the
plans the searches run one after another here find. Run on the CPU with stub launches
(benchmarks/host_region.py): every region is planned for the h100 profile."""
from __future__ import annotations

import json
import re

import pytest
import torch

from fusion_cache import FusionCache
from fusion_cache.frontends import dynamo_backend
from fusion_cache.runtime import compile_ahead, searches_apart
from schedulers import segmenter
from tests.tiny_training import train_tiny_step


@pytest.fixture(autouse=True)
def _dynamo_for_cpu(fresh_dynamo, monkeypatch):
    """conftest's fresh_dynamo, with the fallback allowed: eager runs the CPU ops."""
    monkeypatch.delenv("FUSION_CACHE_DISABLE_FALLBACK", raising=False)


def _stored_plans(name: str) -> list:
    """A training step of the tiny model on a fresh store: every plan the store then holds."""
    torch._dynamo.reset()
    dynamo_backend.reset_reports()
    segmenter._TRIALS.clear()
    FusionCache.reset()
    train_tiny_step(name)
    store = FusionCache.get().store
    plans = []
    for f in store.fusions():
        for p in store.plans_for(f.id):
            plan = json.loads(p.plan_json)
            # the segments' fusion ids: numbered as they came, and the regions whose searches
            # ran apart are planned in the order the children end
            plan.pop("segments", None)
            plan["plan"] = re.sub(r"\[fusion \d+\]", "", plan["plan"])
            plans.append((f.definition_key, p.signature_key, p.target,
                          json.dumps(plan, sort_keys=True)))  # fmt: skip
    return sorted(plans)


def test_searches_apart_find_the_same_plans(tmp_path, monkeypatch):
    found = []
    search = compile_ahead.search_apart

    def counted(needed, on_done):
        done = []
        found.append(search(needed, lambda need: (done.append(need), on_done(need))))
        assert sorted(map(id, done)) == sorted(map(id, needed)), "a region left unplanned"
        return found[-1]

    monkeypatch.setattr(compile_ahead, "search_apart", counted)
    monkeypatch.setenv("FUSION_CACHE_SEARCH_PROCESSES", "0")
    monkeypatch.setenv("FUSION_CACHE_DIR", str(tmp_path / "here"))
    # each run on its own torch caches: a hit on the first run's AOT entry would replay its
    # fused form and search nothing
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "here-torch"))
    here = _stored_plans("llama")
    assert found and not any(found)
    monkeypatch.setenv("FUSION_CACHE_SEARCH_PROCESSES", "4")
    monkeypatch.setenv("FUSION_CACHE_DIR", str(tmp_path / "apart"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "apart-torch"))
    apart = _stored_plans("llama")
    assert sum(found) > 0, "no search ran in a child"
    assert apart == here
    assert any('"scheduler": "segmented"' in p[3] for p in here)


def test_a_failed_child_leaves_the_search_here(monkeypatch):
    from schedulers.device import profile_by_name
    from tests import segment_patterns as sp

    fd = sp.layer_norm_backward_with_bias_grad(torch.float32)
    values = list(sp.layer_norm_backward_inputs(64, 256, torch.float32))
    needs = [searches_apart.SearchNeeded((key,), fd, values, {}, profile_by_name("h100"))
             for key in ("a", "b")]  # fmt: skip
    monkeypatch.setenv("FUSION_CACHE_SEARCH_PROCESSES", "2")
    done = []
    # the shapes left out: each child's search fails, nothing is kept, each is left to here
    assert searches_apart.search_apart(needs, done.append) == 0
    assert searches_apart.take_hint(("a",)) is None
    assert sorted(done, key=lambda need: need.key) == needs


def test_one_search_a_definition_and_work_beside_it(monkeypatch):
    """Note [One search a definition]: needs of one key fork one child, and every one of them
    is planned after it; Note [Work beside the searches]: registered work runs once, while
    the child searches."""
    from schedulers.device import profile_by_name
    from tests import segment_patterns as sp

    fd = sp.layer_norm_backward_with_bias_grad(torch.float32)
    values = list(sp.layer_norm_backward_inputs(64, 256, torch.float32))
    env = segmenter_env(fd, values)
    same = [searches_apart.SearchNeeded(("k",), fd, values, env, profile_by_name("h100"))
            for _ in range(3)]  # fmt: skip
    forks = []
    fork = searches_apart._fork_search
    monkeypatch.setattr(searches_apart, "_fork_search",
                        lambda need: forks.append(need) or fork(need))  # fmt: skip
    monkeypatch.setenv("FUSION_CACHE_SEARCH_PROCESSES", "2")
    done, runs = [], []
    work = searches_apart.Meanwhile(lambda: runs.append(len(forks)) or "pickled")
    with searches_apart.meanwhile(work):
        assert searches_apart.search_apart(same, done.append) == 1
    assert forks == same[:1] and sorted(map(id, done)) == sorted(map(id, same))
    assert runs == [1] and work.result() == "pickled" and runs == [1]
    assert searches_apart.take_hint(("k",)) is not None


def segmenter_env(fd, values) -> dict:
    from fusion_cache.ir.shape_eval import runtime_shapes

    return runtime_shapes(fd, values)


def test_searches_apart_are_off_by_default_without_a_gpu(monkeypatch):
    monkeypatch.delenv("FUSION_CACHE_SEARCH_PROCESSES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert searches_apart.most_children() == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert searches_apart.most_children() >= 1
    monkeypatch.setenv("FUSION_CACHE_SEARCH_PROCESSES", "0")
    assert searches_apart.most_children() == 0


@pytest.mark.parametrize("name", ["FUSION_CACHE_SEARCH_PROCESSES", "FUSION_CACHE_COMPILE_THREADS"])
def test_worker_counts_refuse_what_is_not_a_whole_number(monkeypatch, name):
    from fusion_cache.runtime import pending_compiles

    count = {"FUSION_CACHE_SEARCH_PROCESSES": searches_apart.most_children,
             "FUSION_CACHE_COMPILE_THREADS": pending_compiles.threads}[name]
    for bad in ("four", "-1", "2.5"):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=name):
            count()
    monkeypatch.setenv(name, "1")
    assert count() == 1
    monkeypatch.setenv(name, " ")  # empty: the default
    assert count() >= (0 if name == "FUSION_CACHE_SEARCH_PROCESSES" else 1)
