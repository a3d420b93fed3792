"""The backend's opt-in CUDA-graph mode: each compiled forward and backward graph, regions
and eager ops alike, is captured once and replayed.

Note [CUDA-graph mode]: `torch.compile(model, backend="fusion_cache", mode="reduce-overhead")`
(or `options={"cuda_graphs": True}`, or FUSION_CACHE_CUDA_GRAPHS=1) does for this backend
what the same mode does for inductor, through the same machinery: torch's CUDA-graph trees
(torch._inductor.cudagraph_trees). They read static inputs (parameters, buffers) in place,
copy the other inputs into static buffers, give every graph a private memory pool shared
along a forward/backward tree, re-record when a static input moves, and skip graphs that
mutate other inputs, run on several devices or the CPU. Which inputs are static is
inductor's answer (`_static_inputs`): with nn modules inlined (torch's default), dynamo
hands parameters and buffers in as graph inputs, so AOTAutograd lifts none and the count
of lifted ones that torch's own "cudagraphs" backend uses is zero (a GPT-2 forward's
replay copied 45 of its 78 inputs, parameters among them, into the graph's buffers). Mutated static
inputs (BatchNorm's running statistics) are written in place, as inductor allows.
A graph's first call runs it without capture (regions record their launch sequences and
load their kernels there, Note [Region call]); the capture replays those sequences, whose
launches go to torch's current stream, the capture stream. A new process rebuilds the
graphs from the store: its kernels load, none compiles, and the capture happens again.

As with inductor's mode, a step's outputs live in the pool until the next replay: a loop
that keeps them past the next step calls torch.compiler.cudagraph_mark_step_begin().
"""
from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from torch.fx import GraphModule

from fusion_cache.frontend.options import env_flag
from fusion_cache.runtime.plans import unkept_buffers

GRAPH_MODES = ("reduce-overhead", "max-autotune")  # inductor's modes that capture graphs
ENV = "FUSION_CACHE_CUDA_GRAPHS"


def cuda_graphs_wanted(mode: str | None, options: dict[str, Any] | None) -> bool:
    """Whether torch.compile's mode/options (or the environment) ask for CUDA graphs."""
    options = dict(options or {})
    wanted = options.pop("cuda_graphs", None)
    if options:
        raise ValueError(f"fusion_cache backend: unknown options {sorted(options)}; the "
                         "backend takes options={'cuda_graphs': bool}")  # fmt: skip
    if mode not in (None, "default", "max-autotune-no-cudagraphs", *GRAPH_MODES):
        raise ValueError(f"fusion_cache backend: unknown mode {mode!r}; 'reduce-overhead' "
                         "captures CUDA graphs, 'default' does not")  # fmt: skip
    if wanted is not None:
        return bool(wanted)
    if mode in GRAPH_MODES:
        return True
    return env_flag(ENV, False)


def compile_with_cuda_graphs(gm: GraphModule, example_inputs: Sequence[Any],
                             fuse: Callable[[GraphModule, str], Any]) -> Callable | None:  # fmt: skip
    """AOTAutograd with each aten graph fused by `fuse(graph, kind)` and then captured; None
    (after a warning) where this torch has no CUDA-graph trees."""
    from torch._dynamo.backends.common import aot_autograd

    try:
        from torch._dynamo.backends.cudagraphs import (
            find_input_mutations,
            get_device_index,
            get_stack_traces,
        )
        from torch._inductor.cudagraph_trees import cudagraphify_impl, get_manager
        from torch._inductor.cudagraph_utils import BoxedDeviceIndex, get_placeholder_info
        from torch._inductor.utils import BoxedBool, count_tangents, num_fw_fixed_arguments
    except ImportError as err:  # a torch without CUDA-graph trees: run without graphs
        warnings.warn(f"fusion_cache: CUDA-graph mode needs torch's cudagraph trees ({err}); "
                      "running without CUDA graphs", stacklevel=2)  # fmt: skip
        return None
    from functorch.compile import make_boxed_func

    capturing = BoxedBool(True)
    device_index = BoxedDeviceIndex(None)

    def captured(aot_model: GraphModule, aot_inputs: list, kind: str,
                 static: Sequence[int]) -> Callable:  # fmt: skip
        # read off the aten graph before regions replace its ops
        skip = _skip_reason(aot_model, static)
        mutated = find_input_mutations(aot_model.graph)
        placeholders = get_placeholder_info(aot_model.graph)
        fuse(aot_model, kind)
        if skip:
            return make_boxed_func(aot_model.forward), skip

        def run(args: list) -> Any:
            # the boxed convention cudagraph trees rely on (torch.fx Interpreter.boxed_run):
            # the callee takes the inputs out of the list, so the caller holds none of them
            # (the GPU run on the H100 failed its `assert len(new_inputs) == 0` without it)
            inputs = list(args)
            args.clear()
            with unkept_buffers():  # its allocations are the graph pool's (Note [Scratch per stream])
                return aot_model.forward(*inputs)

        run._boxed_call = True
        out = cudagraphify_impl(run, aot_inputs, static,
                                device_index=get_device_index(aot_model),
                                is_backward=kind == "backward",
                                is_inference=kind == "inference",
                                stack_traces=get_stack_traces(aot_model),
                                placeholders=placeholders,
                                mutated_input_idxs=mutated)  # fmt: skip
        out._boxed_call = True
        return out, None

    def forward(aot_model: GraphModule, aot_inputs: list, kind: str = "forward") -> Callable:
        fixed = num_fw_fixed_arguments(len(example_inputs), len(aot_inputs))
        out, skip = captured(aot_model, aot_inputs, kind, _static_inputs(fixed))
        if skip:
            BoxedBool.disable(capturing)
            _note_skip(skip)
        else:
            device_index.set(get_device_index(aot_model))
        return out

    def backward(aot_model: GraphModule, aot_inputs: list) -> Callable:
        if not capturing:  # the forward runs without graphs: so does its backward
            fuse(aot_model, "backward")
            return make_boxed_func(aot_model.forward)
        # the saved tensors: the forward's outputs (in the tree's pool) and its parameters
        out, skip = captured(aot_model, aot_inputs, "backward",
                             range(count_tangents(aot_model)))  # fmt: skip
        if not skip:
            return out
        _note_skip(skip)
        # the forward was captured: tell the tree its backward now runs outside it
        manager = get_manager(device_index.value or 0, create_if_none_exists=False)

        def run_outside(inputs: list) -> Any:
            if manager is not None:
                manager.set_to_running_backward()
            return out(inputs)

        run_outside._boxed_call = True  # type: ignore[attr-defined]
        return run_outside

    from .recompute import aot_options

    backend = aot_autograd(fw_compiler=forward, bw_compiler=backward,
                           inference_compiler=functools.partial(forward, kind="inference"),
                           **aot_options(graphs=True))  # Note [Min-cut under CUDA graphs]
    return backend(gm, example_inputs)


def _static_inputs(fixed: int) -> list[int]:
    """The forward's inputs at fixed addresses: the `fixed` ones AOTAutograd lifted, and the
    parameters and buffers dynamo passed in (its graph's metadata, as inductor reads it)."""
    static = set(range(fixed))
    try:
        from torch._guards import TracingContext

        context = TracingContext.try_get()
        meta = context.fw_metadata if context is not None else None
        static.update(getattr(meta, "static_input_indices", None) or ())
    except ImportError:  # an older torch: the lifted ones alone
        pass
    return sorted(static)


def _skip_reason(aot_model: GraphModule, static: Sequence[int]) -> str | None:
    """Why `aot_model` cannot be captured, or None: it mutates an input that is not static
    (a copy the replay would lose), or runs on several devices, the CPU, or an op a graph
    cannot hold (torch's own checks)."""
    from torch._dynamo.backends.cudagraphs import find_input_mutations, get_device_node_mapping
    from torch._inductor.cudagraph_utils import (
        check_multiple_devices_or_any_cpu_nodes,
        format_default_skip_message,
        get_mutation_stack_trace,
        get_placeholder_info,
    )
    from torch._inductor.utils import get_first_incompatible_cudagraph_node

    mutated = find_input_mutations(aot_model.graph) - set(static)
    if mutated:
        return get_mutation_stack_trace(get_placeholder_info(aot_model.graph), mutated)
    skip = check_multiple_devices_or_any_cpu_nodes(get_device_node_mapping(aot_model))
    if skip:
        return skip
    node = get_first_incompatible_cudagraph_node(aot_model)
    return format_default_skip_message(f"incompatible op ({node.name})") if node else None


def _note_skip(why: str) -> None:
    warnings.warn(f"fusion_cache: a graph runs without CUDA graphs: {why}", stacklevel=3)
