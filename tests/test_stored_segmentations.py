"""Note [Stored segmentations]: a new process plans a segmented fusion from the groups the
store kept, without searching, and searches again where they do not fit."""
from __future__ import annotations

import json

import pytest
import torch

from fusion_cache import FusionCache
from fusion_cache.runtime.executor import executor_for
from schedulers import segmenter
from schedulers.device import profile_by_name
from tests import segment_patterns as sp


def _plan(fd, inputs):
    """Plan for h100 as a new process would (fresh executor), without loading kernels."""
    FusionCache.get().executors.clear()
    return executor_for(fd).make_plan(inputs, profile_by_name("h100"), load=False)


def _fusion():
    fd = sp.layer_norm_backward_with_bias_grad(torch.float32)
    return fd, list(sp.layer_norm_backward_inputs(64, 256, torch.float32))


def _stored(fd) -> tuple:
    """(store, signature, target, the plan's JSON) of the one plan the store keeps for `fd`."""
    store = FusionCache.get().store
    ((sig, target),) = [(p.signature_key, p.target) for p in store.plans_for(fd.id())]
    return store, sig, target, json.loads(store.get_plan(fd.id(), sig, target))


def test_a_second_plan_takes_the_stored_groups(monkeypatch):
    fd, inputs = _fusion()
    first = _plan(fd, inputs)
    assert hasattr(first, "segments"), "the pattern must segment"
    FusionCache.reset()  # a new process: same store, nothing in memory
    fd, _ = _fusion()

    def no_search(self):
        raise AssertionError("searched again")

    monkeypatch.setattr(segmenter._Segmenter, "run", no_search)
    again = _plan(fd, inputs)
    assert again.description == first.description
    assert [s.sub.records for s in again.segments] == [s.sub.records for s in first.segments]


@pytest.mark.parametrize("damage", ["overlap", "missing", "foreign", "version", "junk"])
def test_groups_that_do_not_fit_are_searched_again(damage, monkeypatch):
    fd, inputs = _fusion()
    first = _plan(fd, inputs)
    store, sig, target, plan = _stored(fd)
    groups = plan["groups"]
    if damage == "overlap":  # an op owned twice
        groups[1][0] = groups[1][0] + groups[0][0][:1]
        groups[1][1] = groups[1][1] + groups[0][0][:1]
    elif damage == "missing":  # a group dropped: its values made by nobody
        del groups[0]
    elif damage == "foreign":  # a position that is no tensor op of this fusion
        groups[0][1] = groups[0][1] + [10_000]
    elif damage == "version":
        plan["segmenter"] = "fc-segments-0:pointwise"
    else:
        plan["groups"] = "junk"
    store.put_plan(fd.id(), sig, target, json.dumps(plan))
    searches, run = [], segmenter._Segmenter.run

    def counted(self):
        searches.append(1)
        return run(self)

    monkeypatch.setattr(segmenter._Segmenter, "run", counted)
    again = _plan(fd, inputs)
    assert searches and again.description == first.description


def _counted_trials(monkeypatch) -> list:
    trials, tried = [], segmenter._Segmenter._try

    def counted(self, sub):
        trials.append(1)
        return tried(self, sub)

    monkeypatch.setattr(segmenter._Segmenter, "_try", counted)
    monkeypatch.setattr(segmenter, "trials_shared", lambda: False)  # each trial reaches _try
    return trials


def test_a_second_plan_takes_the_stored_kinds(monkeypatch):
    """Note [Stored kinds]: no scheduler is tried on the stored groups; the plan is the same."""
    fd, inputs = _fusion()
    first = _plan(fd, inputs)
    kinds = [s.scheduler for s in first.segments]
    assert _stored(fd)[3]["kinds"] == kinds
    FusionCache.reset()
    fd, _ = _fusion()
    trials = _counted_trials(monkeypatch)
    again = _plan(fd, inputs)
    assert not trials
    assert again.description == first.description
    assert [s.scheduler for s in again.segments] == kinds
    assert [s.sub.records for s in again.segments] == [s.sub.records for s in first.segments]


@pytest.mark.parametrize("damage", ["unknown", "short", "none", "absent", "junk"])
def test_stored_kinds_that_do_not_fit_are_tried_again(damage, monkeypatch):
    fd, inputs = _fusion()
    first = _plan(fd, inputs)
    store, sig, target, plan = _stored(fd)
    if damage == "unknown":  # a scheduler this build does not register
        plan["kinds"][0] = "warp_specialized"
    elif damage == "short":
        plan["kinds"] = plan["kinds"][1:]
    elif damage == "none":  # a group only the reference would run
        plan["kinds"][0] = None
    elif damage == "absent":  # a record from before kinds were kept
        del plan["kinds"]
    else:
        plan["kinds"] = "junk"
    store.put_plan(fd.id(), sig, target, json.dumps(plan))
    FusionCache.reset()
    fd, _ = _fusion()
    trials = _counted_trials(monkeypatch)
    again = _plan(fd, inputs)
    assert len(trials) >= len(first.segments)
    assert again.description == first.description
    assert [s.scheduler for s in again.segments] == [s.scheduler for s in first.segments]
