"""Note [Shared trials]: the segmenter's trials answered from the process-wide memo find the
same segmentations as trials made one by one. Run on the CPU with stub launches
(benchmarks/host_region.py): every region of the tiny models' training step is segmented for
the h100 profile, as on the GPU machine."""
from __future__ import annotations

import os

import pytest
import torch

from schedulers import segmenter
from tests.tiny_training import train_tiny_step


@pytest.fixture(autouse=True)
def _dynamo_for_cpu(fresh_dynamo, monkeypatch):
    """conftest's fresh_dynamo, with the fallback allowed: eager runs the CPU ops."""
    monkeypatch.delenv("FUSION_CACHE_DISABLE_FALLBACK", raising=False)
    segmenter._TRIALS.clear()


def _drafts_text(drafts) -> list:
    return [(sorted(d.ops), sorted(d.owned), d.scheduler, tuple(r.key for r in d.sub.records))
            for d in drafts]  # fmt: skip


@pytest.mark.parametrize("name", ["llama", "resnet18"])
def test_shared_trials_find_the_same_segments(name, monkeypatch):
    searches, carved, tried = [], {}, []
    segment, try_shared = segmenter.segment, segmenter._Segmenter._try_shared

    def recorded(fd, values, env, profile, groups=None):
        drafts = segment(fd, values, env, profile, groups)
        if groups is None:
            searches.append((fd, list(values), dict(env), profile, _drafts_text(drafts)))
        return drafts

    def checked(self, ops, finals, shared):
        # a segment key stands for one carving: equal keys, equal records
        key, inputs = self.graph.carve_key(ops, finals, shared)
        sub = self.graph.carve(ops, finals, shared)
        assert list(sub.inputs) == inputs
        text = tuple(r.key for r in sub.records)
        assert carved.setdefault((id(self.graph), key), text) == text
        tried.append(key)
        return try_shared(self, ops, finals, shared)

    monkeypatch.setattr(segmenter, "segment", recorded)
    monkeypatch.setattr(segmenter._Segmenter, "_try_shared", checked)
    train_tiny_step(name)
    assert searches, "the model must segment a region"
    shared = len(segmenter._TRIALS)
    monkeypatch.setattr(segmenter._Segmenter, "_try_shared", try_shared)
    monkeypatch.setenv("FUSION_CACHE_SHARED_TRIALS", "0")
    alone = [_drafts_text(segment(fd, v, env, p)) for fd, v, env, p, _ in searches]
    assert alone == [text for *_, text in searches]
    assert 0 < shared < len(tried), "the memo answered no trial"


def test_the_context_tells_knobs_and_switches_apart(monkeypatch):
    from schedulers.device import profile_by_name
    from schedulers.tuning import overriding, switched_on

    profile = profile_by_name("h100")
    plain = segmenter.trial_context(profile)
    with overriding({"transpose.threads": 128}):
        assert segmenter.trial_context(profile) != plain
    # the switch turned the other way from its default (or from the environment's setting)
    name, before = "FUSION_CACHE_VIEWS_TO_READERS", os.environ.get("FUSION_CACHE_VIEWS_TO_READERS")
    monkeypatch.setenv(name, "0" if switched_on("VIEWS_TO_READERS") else "1")
    assert segmenter.trial_context(profile) != plain
    if before is None:
        monkeypatch.delenv(name)
    else:
        monkeypatch.setenv(name, before)
    assert segmenter.trial_context(profile) == plain
    assert segmenter.trial_context(profile_by_name("a100")) != plain


def test_stand_in_keys_tell_layouts_apart():
    a = torch.empty((4, 8), device="meta")
    assert segmenter.stand_in_key(a) == segmenter.stand_in_key(torch.empty((4, 8), device="meta"))
    assert segmenter.stand_in_key(a) != segmenter.stand_in_key(a.t())
    assert segmenter.stand_in_key(a) != segmenter.stand_in_key(a.half())
    assert segmenter.stand_in_key(1) != segmenter.stand_in_key(1.0)
