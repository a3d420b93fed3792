"""The backend's graphs in torch's AOTAutograd cache (Note [AOT cache] in
fusion_cache/frontends/aot_cache.py): a fresh torch state (dynamo reset, a new FusionCache on
the same store and the same torch cache directory) takes the compiled graphs from the cache,
fuses the same regions and trains as eager does; a new process on the warm store and cache
compiles no kernel. The entries hold fused forms (or aten graphs), no region, plan or kernel."""
from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks import models
from benchmarks.model_defs import model_cases
from fusion_cache import FusionCache
from fusion_cache.frontends import dynamo_backend
from fusion_cache.frontends.aot_cache import cache_counters


class Block(nn.Module):
    def __init__(self, d: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + self.fc2(F.gelu(self.fc1(self.norm(x))))).square().mean()


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py


def _fresh_torch_state() -> None:
    """What a new process starts from, but for what it imported: no dynamo frames, no
    trie, a store opened again from the environment."""
    torch._dynamo.reset()
    dynamo_backend.reset_reports()
    FusionCache.reset()


def _train(steps: int = 3, backend: str | None = "fusion_cache") -> tuple[list, list, dict]:
    """Losses, final weights and the AOT cache counters' change over `steps` SGD steps."""
    torch.manual_seed(0)
    model = Block()
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randn(4, 8, 16, generator=gen) for _ in range(steps)]
    fn = torch.compile(model, backend=backend) if backend else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = cache_counters()
    losses = []
    for x in batches:
        opt.zero_grad()
        loss = fn(x)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    after = cache_counters()
    weights = [p.detach().clone() for p in model.parameters()]
    return losses, weights, {k: after[k] - before[k] for k in after}


def _entries() -> list[Path]:
    return sorted(Path(os.environ["TORCHINDUCTOR_CACHE_DIR"], "aotautograd").rglob("*"))


def test_a_fresh_torch_state_takes_the_graphs_from_the_cache():
    eager_losses, eager_weights, _ = _train(backend=None)
    cold_losses, cold_weights, cold = _train()
    assert cold["miss"] == 1 and cold["saved"] == 1 and cold["hit"] == 0, cold
    cold_reports = dynamo_backend.reports()
    assert {r["graph"] for r in cold_reports} == {"forward", "backward"}

    _fresh_torch_state()
    warm_losses, warm_weights, warm = _train()
    assert warm["hit"] == 1 and warm["miss"] == 0 and warm["bypass"] == 0, warm
    # the cached graphs (forms replayed, by default) give the same regions over the same ops
    warm_reports = dynamo_backend.reports()
    for key in ("graph", "regions", "ops_fused", "fused_ops", "eager_ops"):
        assert [r[key] for r in warm_reports] == [r[key] for r in cold_reports], key
    assert warm_losses == cold_losses
    for got, want in zip(warm_weights, cold_weights):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert warm_losses == pytest.approx(eager_losses, rel=1e-5)
    for got, want in zip(warm_weights, eager_weights):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("form", ["0", ""])
def test_an_entry_holds_no_region_plan_or_kernel(form, monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_AOT_FORM", form)
    _train(steps=1)
    files = [p for p in _entries() if p.is_file()]
    assert files
    for path in files:
        data = path.read_bytes()
        # of this project, only the OutputCode's class (and the form's node names): no
        # RegionCall, definition, plan or kernel object, no store entry
        ours = {b"fusion_cache.frontends.aot_cache"}
        if form != "0":  # the form, by default
            ours.add(b"fusion_cache.frontends.fused_form")
            assert b'"kind":"op"' in data  # a region's records
        assert set(re.findall(rb"fusion_cache[\w.]*", data)) == ours
        assert b"aten" in data


def test_a_cached_graph_is_rebuilt_without_fusing_it_again(monkeypatch):
    """Note [Fused graph form]: the warm graphs come from their forms, not from fuse_graph."""
    monkeypatch.setenv("FUSION_CACHE_AOT_FORM", "1")
    cold_losses, cold_weights, _ = _train()
    _fresh_torch_state()

    def refuse(*args, **kwargs):
        raise AssertionError("a cached graph was fused again")

    monkeypatch.setattr(dynamo_backend, "fuse_graph", refuse)
    warm_losses, warm_weights, warm = _train()
    assert warm["hit"] == 1 and warm["bypass"] == 0, warm
    assert warm_losses == cold_losses
    for got, want in zip(warm_weights, cold_weights):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert all(r["fuse_s"] < 5 for r in dynamo_backend.reports())


def test_a_graph_without_a_form_is_kept_as_its_aten_graph(monkeypatch):
    """Where describe cannot hold a fused graph, the entry keeps the aten graph, fused again
    on load."""
    from fusion_cache.frontends import fused_form

    monkeypatch.setenv("FUSION_CACHE_AOT_FORM", "1")
    monkeypatch.setattr(fused_form, "describe", lambda *args: None)
    cold_losses, cold_weights, _ = _train()
    cold_reports = dynamo_backend.reports()
    _fresh_torch_state()
    warm_losses, warm_weights, warm = _train()
    assert warm["hit"] == 1 and warm["bypass"] == 0, warm
    assert [r["fused_ops"] for r in dynamo_backend.reports()] == [
        r["fused_ops"] for r in cold_reports]
    assert warm_losses == cold_losses
    for got, want in zip(warm_weights, cold_weights):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_form_that_does_not_pickle_keeps_the_aten_graph(monkeypatch):
    """A region subgraph that GraphPickler refuses leaves the entry with the aten graph, not
    without an entry (the warm process would trace AOTAutograd again)."""
    from fusion_cache.frontends import fused_form

    def fails(*args):
        raise AttributeError("Can't pickle local object")

    monkeypatch.setenv("FUSION_CACHE_AOT_FORM", "1")
    monkeypatch.setattr(fused_form, "describe", fails)
    assert _train(steps=1)[2]["saved"] == 1
    _fresh_torch_state()
    assert _train(steps=1)[2]["hit"] == 1


def test_the_llama_style_graphs_are_kept_in_their_form(monkeypatch):
    """The tiny Llama-style model's regions hold views that Note [Casts before views] made:
    their fake values are tensors of their own, which GraphPickler pickles (a fake view keeps
    its base's fake mode, which it cannot), so the form holds both graphs."""
    from fusion_cache.frontends import aot_cache
    from tests.tiny_training import train_tiny_step

    monkeypatch.delenv("FUSION_CACHE_DISABLE_FALLBACK", raising=False)  # eager's CPU ops
    monkeypatch.setenv("FUSION_CACHE_AOT_FORM", "1")
    kept = []
    compile_cached = aot_cache.compile_cached
    monkeypatch.setattr(aot_cache, "compile_cached",
                        lambda gm, kind: kept.append(compile_cached(gm, kind)) or kept[-1])
    before = cache_counters()
    train_tiny_step("llama")
    assert cache_counters()["saved"] - before["saved"] == 1
    assert [(c.kind, c.form is not None, c.unsaved) for c in kept] == [
        ("forward", True, ""), ("backward", True, "")]


def test_a_rebuilt_region_lowers_its_graph_again_for_other_strides():
    """A rebuilt region holds its subgraph pickled: a call with strides other than the traced
    ones unpickles it and defines the region again (Note [Region call])."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fusion_cache.frontends.aot_cache import dump_graph, load_graph
    from fusion_cache.frontends.fused_form import describe, rebuild

    def fn(x, b):
        return F.gelu(x * 2.0 + b).sum(-1)

    x, b = torch.randn(6, 8), torch.randn(8)
    gm = make_fx(fn, tracing_mode="fake")(x, b)
    report = dynamo_backend.fuse_graph(gm)
    assert report["regions"] == 1
    form = describe(gm, report, dump_graph)
    assert form is not None
    fused, (region,), again = rebuild(form, load_graph)
    assert again["fused_ops"] == report["fused_ops"]
    assert region._region_graph is None  # not unpickled until needed
    torch.testing.assert_close(fused(x, b), fn(x, b))
    assert region.redefined == 0
    xt = torch.randn(8, 6).t()  # the same sizes, transposed strides
    torch.testing.assert_close(fused(xt, b), fn(xt, b))
    assert region.redefined == 1 and region._region_graph is not None


def test_a_rebuilt_region_keeps_every_definition_it_held():
    """A definition built before the form was taken (at lowering, for the strides a first
    call brings: dynamo_backend._first_call_inputs) is kept with the traced one, so a call
    with those strides needs no subgraph after a restart (Note [Fused graph form])."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fusion_cache.frontends.aot_cache import dump_graph, load_graph
    from fusion_cache.frontends.fused_form import describe, rebuild

    def fn(x, b):
        return F.gelu(x * 2.0 + b).sum(-1)

    x, b = torch.randn(6, 8), torch.randn(8)
    xt = torch.randn(8, 6).t()  # the same sizes, transposed strides
    gm = make_fx(fn, tracing_mode="fake")(x, b)
    report = dynamo_backend.fuse_graph(gm)
    gm(xt, b)  # defines the region for xt's strides too
    form = describe(gm, report, dump_graph)
    fused, (region,), _ = rebuild(form, load_graph)
    assert len(region.definitions) == 2
    for args in ((xt, b), (x, b)):
        torch.testing.assert_close(fused(*args), fn(*args))
    assert region.redefined == 0 and region._region_graph is None


def test_a_fusing_knob_keeps_its_own_entries(monkeypatch):
    """FUSION_CACHE_EAGER_OPS changes the regions: a form fused under another setting is
    never taken."""
    _train(steps=1)
    _fresh_torch_state()
    monkeypatch.setenv("FUSION_CACHE_EAGER_OPS", "gelu,gelu_backward")
    eager_losses, *_ = _train(backend=None)
    losses, _, counted = _train()
    assert counted["hit"] == 0 and counted["miss"] == 1, counted
    assert losses == pytest.approx(eager_losses, rel=1e-5)
    assert not any("gelu" in op for r in dynamo_backend.reports() for op in r["fused_ops"])


def test_the_knob_turns_the_cache_off(monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_AOT_CACHE", "0")
    eager_losses, *_ = _train(backend=None)
    losses, _, counted = _train()
    assert counted == {"hit": 0, "miss": 0, "bypass": 0, "saved": 0}
    assert not _entries()
    assert losses == pytest.approx(eager_losses, rel=1e-5)
    _fresh_torch_state()
    assert _train()[2]["hit"] == 0


def test_an_entry_without_the_backends_tag_is_not_taken():
    """Another backend that bundles its OutputCode into the same cache (aot_eager does on
    newer torch) writes under the same torch key but for the tag: never ours to load."""
    from torch._dynamo.backends.common import aot_autograd

    from fusion_cache.frontends.aot_cache import serializable_compilers

    def untagged(gm, example_inputs):
        import torch._functorch.config as functorch_config

        with functorch_config.patch(bundled_autograd_cache=True,
                                    force_non_lazy_backward_lowering=True):  # fmt: skip
            return aot_autograd(**serializable_compilers())(gm, example_inputs)

    other = _train(backend=untagged)[2]
    assert other["saved"] == 1
    _fresh_torch_state()
    ours = _train()[2]
    assert ours["hit"] == 0 and ours["miss"] == 1, ours
    _fresh_torch_state()  # beside the other's entry, the backend's own is found
    assert _train()[2]["hit"] == 1


@pytest.mark.filterwarnings("error::UserWarning:fusion_cache.runtime.engine")
def test_a_new_process_on_the_warm_store_compiles_nothing(monkeypatch):
    """benchmarks.models' warm child: a new process. With stub launches (benchmarks/host_region.py)
    the plans are made for the h100 profile and NVRTC compiles here, as on the GPU machine."""
    monkeypatch.delenv("FUSION_CACHE_DISABLE_FALLBACK", raising=False)  # eager's CPU ops
    case = next(c for c in model_cases(tiny=True) if c.name == "gpt2")
    cold = models.run_contender("fusion_cache", case, 2, "cpu", stub=True)
    assert cold["counters"]["kernels_compiled"] > 0
    assert cold["aot_cache"]["saved"] == 1 and cold["aot_cache"]["hit"] == 0
    args = argparse.Namespace(steps=2, device="cpu", tiny=True, stub=True,
                              deterministic=False)
    warm = models.run_warm_child(case, args, os.environ["FUSION_CACHE_DIR"])
    assert "error" not in warm, warm.get("error")
    assert warm["aot_cache"] == {"hit": 1, "miss": 0, "bypass": 0, "saved": 0}
    assert warm["counters"]["kernels_compiled"] == 0
    assert warm["counters"]["kernels_loaded"] > 0
    assert warm["kernels"] == cold["kernels"]
    assert warm["fused_ops"] == cold["fused_ops"] and warm["regions"] == cold["regions"]


_CHILD = """
import sys, json, torch
from fusion_cache.frontends import register_backend
from fusion_cache.frontends.aot_cache import cache_counters
if sys.argv[1] == "registered":  # as in a process that compiled with inductor before
    from torch._inductor.codegen.common import init_backend_registration
    init_backend_registration()
register_backend()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16), torch.nn.GELU())
torch.compile(model, backend="fusion_cache")(torch.randn(8, 16)).sum().backward()
print("CHILD " + json.dumps({"aot": cache_counters(), "codegen": any(
    m.startswith("torch._inductor.codegen.") and "scheduling" in m for m in sys.modules)}))
"""


def _child(mode: str) -> dict:
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, text=True,
                          env=env, cwd=root, timeout=600)  # fmt: skip
    line = next((x for x in done.stdout.splitlines() if x.startswith("CHILD ")), None)
    assert done.returncode == 0 and line, done.stderr[-3000:]
    return json.loads(line[len("CHILD "):])


def test_the_key_needs_no_code_generator_and_is_the_same_in_every_process():
    """Note [AOT cache key without code generators]: a process using only this backend
    does not import inductor's scheduling modules for the key, and a process that registered
    them (one that used inductor too) computes the same key."""
    cold = _child("plain")
    assert cold["aot"]["saved"] == 1 and not cold["codegen"], cold
    warm = _child("registered")
    assert warm["aot"]["hit"] == 1 and warm["aot"]["miss"] == 0, warm


def test_the_min_cut_keeps_its_own_entries_and_takes_them_again(monkeypatch):
    """FUSION_CACHE_MIN_CUT changes what the forward saves (Note [Recompute in the backward]);
    its graphs go in the cache under its switch's tag: never taken for the default
    partition's, and taken by a fresh torch state under the same switch."""
    _train(steps=1)  # the default partition's entry
    _fresh_torch_state()
    monkeypatch.setenv("FUSION_CACHE_MIN_CUT", "1")
    eager_losses, eager_weights, _ = _train(backend=None)
    cold_losses, _, cold = _train()
    assert cold["hit"] == 0 and cold["miss"] == 1 and cold["saved"] == 1, cold
    _fresh_torch_state()
    warm_losses, warm_weights, warm = _train()
    assert warm["hit"] == 1 and warm["miss"] == 0 and warm["bypass"] == 0, warm
    assert warm_losses == cold_losses
    assert warm_losses == pytest.approx(eager_losses, rel=1e-5)
    for got, want in zip(warm_weights, eager_weights):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
