"""execute's keyword arguments do what nvFuser documents (fusion_cache/frontend/run_options.py,
fusion_cache/frontend/repro.py, fusion_cache/runtime/run_context.py); CPU inputs here, the
kernel side in tests/gpu/test_execute_options_gpu.py."""
from __future__ import annotations

import warnings

import pytest
import torch

from fusion_cache import DataType, FusionDefinition
from fusion_cache.frontend.definition import FusionDefinitionError


def scaled_exp() -> FusionDefinition:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[False, False], dtype=DataType.Float)
        s = fd.define_scalar(dtype=DataType.Double)
        fd.add_output(fd.ops.mul(fd.ops.exp(t0), s))
    return fd


def test_save_repro_inputs_keeps_layouts_and_the_script_reruns_the_fusion():
    fd = scaled_exp()
    x = torch.randn(6, 4).t()  # a transposed input: the script must keep its strides
    fd.execute([x, 2.5], save_repro_inputs=True)
    script = fd.last_repro_script()
    assert f"nvfuser_fusion_id{fd.id()}(fd)" in script
    assert "as_strided((4, 6), (1, 4))" in script and "2.5," in script
    scope: dict = {}
    exec(compile(script, "<repro>", "exec"), scope)  # builds, defines and executes
    assert scope["fd"].id() == fd.id()
    (out,) = scope["fd"].execute(scope["inputs"])
    assert out.shape == (4, 6)
    torch.testing.assert_close(out, torch.exp(scope["inputs"][0]) * 2.5)


def test_last_repro_script_without_saved_inputs_says_how():
    fd = scaled_exp()
    fd.execute([torch.randn(2, 2), 1.0])
    with pytest.raises(FusionDefinitionError, match="save_repro_inputs=True"):
        fd.last_repro_script()


def test_print_repro_prints_the_script_for_these_inputs(capsys):
    fd = scaled_exp()
    fd.execute([torch.randn(3, 5), 1.5], print_repro=True)
    printed = capsys.readouterr().out
    assert printed.startswith("# a fusion-cache reproduction script")
    assert "fd.execute(inputs)" in printed and "as_strided((3, 5), (5, 1))" in printed
    assert "    1.5," in printed and f"nvfuser_fusion_id{fd.id()}(fd)" in printed


def test_repro_script_for_without_inputs_is_the_definition_alone():
    fd = scaled_exp()
    script = fd.repro_script_for()
    assert "inputs" not in script and script.rstrip().endswith(f"nvfuser_fusion_id{fd.id()}(fd)")


def test_capture_debug_output_keeps_what_the_run_printed(monkeypatch, capsys):
    fd = scaled_exp()
    monkeypatch.setenv("FUSION_CACHE_DUMP", "print_args,scheduler")
    fd.execute([torch.randn(2, 3), 2.0], capture_debug_output=True)
    captured = fd.debug_output()
    assert "reference evaluator" in captured and "((2, 3), (3, 1), torch.float32)" in captured
    assert capsys.readouterr().out == ""  # captured, not printed
    fd.execute([torch.randn(2, 3), 2.0])
    assert fd.debug_output() is None  # as nvFuser: None after a call that did not capture


def test_profile_without_profiling_raises_nvfusers_error():
    fd = scaled_exp()
    fd.execute([torch.randn(2, 2), 1.0])
    with pytest.raises(ValueError, match="not previously called with profiling enabled"):
        fd.profile()


def test_profile_of_a_cpu_run_says_no_kernel_ran():
    fd = scaled_exp()
    x = torch.randn(5, 7)
    (out,) = fd.execute([x, 3.0], profile=True)
    torch.testing.assert_close(out, torch.exp(x) * 3.0)
    prof = fd.profile()
    assert prof.fusion_id == fd.id() and prof.kernel_profiles == () and prof.segments == 0
    assert prof.ran_on == "reference evaluator" and prof.host_time_ms > 0
    assert "0 kernels" in str(prof)


def test_unknown_and_foreign_options_warn_and_known_ones_act():
    fd = scaled_exp()
    x = torch.randn(2, 2)
    with pytest.warns(UserWarning, match="unknown _enable_options 'no_such_option'"):
        fd.execute([x, 1.0], _enable_options=["no_such_option"])
    with pytest.warns(UserWarning, match="nvFuser option with no effect"):
        fd.execute([x, 1.0], _disable_options=["parallel_compile"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fd.execute([x, 1.0], _disable_options=["fallback"], _enable_options=[])
        fd.execute([x, 1.0], _enable_options=None, _disable_options=None)  # Thunder's defaults
        (out,) = fd.execute([x, 1.0], _enable_options=["kernel_profile"])
    assert fd.profile().ran_on == "reference evaluator"  # kernel_profile turns profiling on
    with pytest.raises(TypeError, match="list of option names"):
        fd.execute([x, 1.0], _enable_options="fallback")


def test_execute_rejects_unknown_keywords():
    fd = scaled_exp()
    with pytest.raises(TypeError, match="unexpected keyword"):
        fd.execute([torch.randn(2, 2), 1.0], save_repro_state=True)


def test_a_user_schedule_is_refused_unless_overridden():
    class Scheduled(FusionDefinition):
        def definition(self):
            t0 = self.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
            self.add_output(self.ops.neg(t0))

        def schedule(self):
            raise AssertionError("never called")

    fd = Scheduled()
    x = torch.randn(4)
    with pytest.raises(FusionDefinitionError, match=r"defines schedule\(\).*override_user_schedule"):
        fd.execute([x])
    (out,) = fd.execute([x], override_user_schedule=True)
    torch.testing.assert_close(out, -x)


def test_subclass_without_definition_raises_not_implemented():
    class Empty(FusionDefinition):
        pass

    fd = Empty()
    with pytest.raises(NotImplementedError, match="definition\\(\\) should be implemented"):
        fd.execute([])
    with pytest.raises(NotImplementedError):
        fd.execute([])  # the same error again; the cache is left as it was


def test_device_keyword_rejects_what_is_not_a_device():
    fd = scaled_exp()
    with pytest.raises(ValueError, match="is not a device"):
        fd.execute([torch.randn(2, 2), 1.0], device="gpu7")
