"""The backend's compiled graphs in torch's AOTAutograd cache, so a restart skips AOTAutograd.

Note [AOT cache]: a warm process's first step (its kernels in the store, nothing to
compile) spent most of its time in torch: dynamo's trace, then AOTAutograd's joint graph,
functionalization and partitioner for every graph, before this backend saw a region. Torch
caches AOTAutograd's result across processes (torch._functorch._aot_autograd.autograd_cache,
on disk under TORCHINDUCTOR_CACHE_DIR/aotautograd) for compilers that return an `OutputCode`
it can pickle: with `bundled_autograd_cache` the entry holds the OutputCode itself.

`FusedGraph` is that OutputCode. What it pickles is the aten graph AOTAutograd gave the
backend (torch.fx's GraphPickler: nodes, aten ops, fake-tensor metadata), taken before
`fuse_graph` rewrote it, and fused again on load (FUSION_CACHE_AOT_FORM=0); or, by default,
the fused graph's form (Note [Fused graph form] in fused_form.py: the aten calls around the regions,
and each region's definition records, input specs and constants), whose records are
replayed on load. No kernel, plan, region object or store entry: fusion ids, segmentations
and cubins come from the fusion store by key, as a cold process wrote them. So the store stays bytes and JSON only (DESIGN.md, the store), and a
store emptied meanwhile only means compiles.

The entry's key is torch's (the dynamo graph, its inputs' metadata, torch's and inductor's
configuration) plus `cache_key_tag`, to which the backend adds its tag (`backend_tag`): the
form's version and a hash of the sources that make records (the frontend and the lowerings),
so an entry written by other lowerings is never replayed, and another backend's entry for the
same graph (aot_eager's, bundled too) is never taken for this one's; and the knobs that
change how a graph is fused (`knobs_tag`), among them the switches that pick the partitioner and
decompositions AOTAutograd is asked for (torch's key names neither; recompute.cache_safe).
FUSION_CACHE_AOT_CACHE=0 turns it off (so does
FUSION_CACHE_DUMP=graph, whose listing comes from fusing); torch's own switches
(TORCHINDUCTOR_FORCE_DISABLE_CACHES=1, torch._functorch.config.enable_autograd_cache) too.
The CUDA-graph mode (Note [CUDA-graph mode]) does not use it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.fx import GraphModule

from fusion_cache.frontend.options import env_flag

ENV = "FUSION_CACHE_AOT_CACHE"
FORM_ENV = "FUSION_CACHE_AOT_FORM"
# bump when what AOTAutograd is asked for changes; 2: input mutations kept (Note [Buffer
# updates in place])
TAG = "fusion_cache-aot-2"


@functools.cache
def backend_tag() -> str:
    """TAG, the fused form's version, and a hash of the sources whose changes change the
    records a graph lowers to: the frontend (records, ops) and the backend (lowerings)."""
    from fusion_cache.runtime.source_digest import sources_digest

    from .fused_form import FORM

    digest = sources_digest(Path(__file__).resolve().parents[1],
                            ("frontend/**/*.py", "frontends/*.py"))  # fmt: skip
    return f"{TAG}-form{FORM}-{digest[:16]}"


def knobs_tag() -> str:
    """The knobs that change how a graph is fused (FUSION_CACHE_SINGLE_NODE,
    FUSION_CACHE_EAGER_OPS, FUSION_CACHE_CONV_LAYOUT, the switches of Note [Unmeasured
    switches]): a fused form is kept for the knobs it was fused under."""
    from schedulers.tuning import switches_on

    from .aten_library import conv_layout_knob
    from .dynamo_backend import single_node_allowed
    from .fx_support import eager_ops

    return (f"single{int(single_node_allowed())}-eager[{','.join(sorted(eager_ops()))}]"
            f"-conv[{conv_layout_knob()}]-switches[{','.join(switches_on())}]")


def aot_cache_wanted() -> bool:
    """Whether the backend puts its graphs in torch's AOTAutograd cache (default: yes; not
    with FUSION_CACHE_DUMP=graph, which prints what fusing a graph decides)."""
    from fusion_cache.frontend.options import dump_enabled

    if dump_enabled("graph"):
        return False
    return env_flag(ENV, True)


def _output_code_base() -> type | None:
    try:
        from torch._inductor.output_code import OutputCode
    except ImportError:  # a torch without it: no AOTAutograd cache for other backends
        return None
    return OutputCode


_OutputCode = _output_code_base() or object


@dataclasses.dataclass
class FusedGraph(_OutputCode):  # type: ignore[misc, valid-type]
    """One aten graph as the backend runs it (its regions fused), and as torch's cache
    keeps it (Note [AOT cache]): the fused graph's form (Note [Fused graph form]), or where
    it has none, the aten graph before fusion, pickled."""

    kind: str = "forward"
    form: dict | None = None
    aten_graph: bytes = b""
    # the fused graph's boxed call; None in a pickled or not yet loaded entry
    _run: Callable[[list], Any] | None = dataclasses.field(default=None, compare=False)
    unsaved: str = ""  # why the graph could not be kept (then it is not saved)

    def __post_init__(self) -> None:
        # torch passes the inputs as one list; an attribute of the instance, as the wrappers
        # torch puts around a backward copy it with functools.wraps
        self._boxed_call = True

    def __call__(self, inputs: list) -> Any:
        return self._run(inputs)  # type: ignore[misc]

    def prepare_for_serialization(self) -> None:
        if self.unsaved:  # torch counts it a bypass and keeps running the live graph
            raise RuntimeError(f"fusion_cache: the graph could not be kept: {self.unsaved}")
        self._run = None  # torch pickles a shallow copy: the live one keeps running

    def post_compile(self, example_inputs: Sequence[Any], constants: Any,
                     graph_kwargs: Any) -> None:  # fmt: skip
        if self._run is not None:
            return
        if self.form is not None:  # loaded from the cache: rebuild the fused graph
            from .dynamo_backend import record_rebuilt
            from .fused_form import rebuild

            start = time.perf_counter()
            gm, regions, report = rebuild(self.form, load_graph)
            record_rebuilt(report, regions, time.perf_counter() - start)
            self._run = make_boxed_func(gm.forward)
        else:  # the aten graph: fuse it again
            self._run = fused_call(load_graph(self.aten_graph), self.kind)[0]

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        pass  # no Triton kernels


def make_boxed_func(fn: Callable) -> Callable[[list], Any]:
    from functorch.compile import make_boxed_func as boxed

    return boxed(fn)


def fused_call(gm: GraphModule, kind: str) -> tuple[Callable[[list], Any], dict[str, Any]]:
    """fuse_graph on gm, in place: its boxed call and the report."""
    from .dynamo_backend import fuse_graph

    report = fuse_graph(gm, kind)
    return make_boxed_func(gm.forward), report


def dump_graph(gm: GraphModule) -> bytes:
    from torch.fx._graph_pickler import GraphPickler, Options

    return GraphPickler.dumps(gm, Options(ops_filter=None))


def load_graph(data: bytes) -> GraphModule:
    from torch._subclasses import FakeTensorMode
    from torch.fx._graph_pickler import GraphPickler
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    gm = GraphPickler.loads(data, FakeTensorMode(shape_env=ShapeEnv()))
    if not isinstance(gm, GraphModule):
        raise TypeError(f"a cached graph unpickled to {type(gm).__name__}")
    return gm


def copy_graph(gm: GraphModule) -> GraphModule:
    """A GraphModule over a copy of gm's graph (node metadata shared, not copied)."""
    graph = torch.fx.Graph()
    value, output = graph.graph_copy(gm.graph, {}, return_output_node=True)
    graph.output(value, type_expr=output.type).meta = dict(output.meta)
    return GraphModule(gm, graph)


def form_wanted() -> bool:
    """Entries keep the fused graph's form (Note [Fused graph form]) rather than the aten graph;
    FUSION_CACHE_AOT_FORM=0 keeps the aten graph. On by default since it was timed on the H100
    (18:17 UTC, Llama-style warm: the backend's load 0.22 s against 1.23 s, docs/restarts.md)."""
    return env_flag(FORM_ENV, True)


def compile_cached(gm: GraphModule, kind: str) -> FusedGraph:
    """The backend's compiler for one aten graph, as torch's AOTAutograd cache wants it.
    A copy of the aten graph is fused; the aten graph itself, or with the form the regions'
    subgraphs, are pickled while the regions' searches run where they run apart. With the
    form, the aten graph is kept only where the form cannot be."""
    from fusion_cache.runtime.searches_apart import Meanwhile, meanwhile

    code = FusedGraph(kind)
    try:
        fused = copy_graph(gm)
        # Note [Work beside the searches]: the pickling runs while the regions' searches do
        if form_wanted():
            from .fused_form import describe

            with meanwhile(Meanwhile(lambda: _region_dumps(fused))) as pickled:
                code._run, report = fused_call(fused, kind)
            dumps = pickled.result()
            try:
                code.form = describe(fused, report,
                                     lambda g: dumps.get(id(g), (None, b""))[1] or dump_graph(g))
            except Exception:  # noqa: BLE001 - a region's subgraph that does not pickle
                code.form = None  # (the aten graph then may): kept as the aten graph
            if code.form is None:
                code.aten_graph = dump_graph(gm)
        else:
            with meanwhile(Meanwhile(lambda: dump_graph(gm))) as pickled:
                code._run, _ = fused_call(fused, kind)
            code.aten_graph = pickled.result()
    except Exception as err:  # noqa: BLE001 - a graph that cannot be kept runs, uncached
        code.form, code.unsaved = None, f"{type(err).__name__}: {err}"
    if code._run is None:
        code._run = fused_call(gm, kind)[0]
    return code


def _region_dumps(fused: GraphModule) -> dict[int, tuple[GraphModule, bytes]]:
    """The pickled subgraph of each region `fused` calls so far, by the subgraph's id (kept
    beside it, so the id stays its own); one that does not pickle is left to describe."""
    from .fx_region import RegionCall

    found: dict[int, tuple[GraphModule, bytes]] = {}
    for node in fused.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, RegionCall):
            graph = node.target.region_graph
            try:
                found[id(graph)] = (graph, dump_graph(graph))
            except Exception:  # noqa: BLE001 - describe pickles it again and says why
                continue
    return found


def serializable_compilers() -> dict[str, Any] | None:
    """fw/bw/inference compilers for torch's aot_autograd that return FusedGraphs, or None
    where this torch cannot cache another backend's graphs."""
    try:
        from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler
    except ImportError:
        return None
    if _output_code_base() is None:
        return None

    def compiler(kind: str) -> Any:
        def compile_graph(gm: GraphModule, example_inputs: Sequence[Any]) -> FusedGraph:
            return compile_cached(gm, kind)

        return SerializableAOTDispatchCompiler(FusedGraph, compile_graph)

    return {"fw_compiler": compiler("forward"), "bw_compiler": compiler("backward"),
            "inference_compiler": compiler("inference")}  # fmt: skip


@contextlib.contextmanager
def cache_settings() -> Iterator[None]:
    """torch's settings under which AOTAutograd caches the backend's graphs: bundled
    entries (the OutputCode in the entry), this backend's tag in the key, and the backward
    compiled with the forward. torch saves an entry once both are compiled and reads these
    settings then: compiled lazily, at the first backward, the backward would be saved
    after this context ended, as an entry for inductor's cache."""
    import torch._functorch.config as functorch_config
    import torch.compiler.config as compiler_config

    tag = compiler_config.cache_key_tag
    ours = f"{backend_tag()}-{knobs_tag()}"
    tag = f"{tag}+{ours}" if tag else ours
    with functorch_config.patch(bundled_autograd_cache=True,
                                force_non_lazy_backward_lowering=True), \
            compiler_config.patch(cache_key_tag=tag), _without_inductor_backends():  # fmt: skip
        yield


# what torch's key reads of inductor's code generators (torch._inductor.codecache)
_BACKEND_NAMES = ("init_backend_registration", "custom_backend_passes",
                  "custom_backend_codegen_configs")  # fmt: skip


@contextlib.contextmanager
def _without_inductor_backends() -> Iterator[None]:
    """Note [AOT cache key without code generators]: torch's key (FxGraphHashDetails) first
    registers inductor's code generators for every device, to hash the custom passes and
    configurations of each: an import of inductor's scheduling modules that a process using
    only this backend never needed (1.5 s on this CPU, a fifth of a warm first step). Their
    passes never run on this backend's graphs, so the key leaves them out: the registration
    is skipped and both tables read empty, whatever another compile registered, so the key
    is the same in every process. Dynamo compiles one frame at a time (its compile lock),
    so no other key is computed meanwhile. Where this torch has other names, nothing is
    patched and the key is torch's own."""
    try:
        from torch._inductor import codecache
    except ImportError:
        yield
        return
    saved = {name: getattr(codecache, name, None) for name in _BACKEND_NAMES}
    if any(value is None for value in saved.values()):
        yield
        return
    codecache.init_backend_registration = _registered_none
    codecache.custom_backend_passes = {}
    codecache.custom_backend_codegen_configs = {}
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(codecache, name, value)


def _registered_none() -> None:
    return None


def cache_counters() -> dict[str, int]:
    """torch's AOTAutograd cache counters of this process: hits, misses, bypasses, saves."""
    from torch._dynamo.utils import counters

    aot = counters["aot_autograd"]
    return {k: int(aot.get(f"autograd_cache_{k}", 0)) for k in ("hit", "miss", "bypass", "saved")}
