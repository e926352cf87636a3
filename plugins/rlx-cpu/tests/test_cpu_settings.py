"""rlx-cpu's ``RLX_CPU_*`` variables: declared once (``rlx_cpu.settings``), handed to the
core's settings table by ``CpuBackend.settings``, and strict where they are read:
garbage used to mean the default without a word. Also: NaN and Inf inputs give NaN and
Inf, not numpy RuntimeWarnings from inside the kernels."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core.errors import ConfigError
from rlx_cpu import CpuBackend, blas, conv_choice, gemm, native, settings

READERS = {
    "RLX_CPU_GEMM": gemm.mode,
    "RLX_CPU_CONV": conv_choice.mode,
    "RLX_CPU_NATIVE": native.wanted,
    "RLX_CPU_BLAS": blas.wanted,
    "RLX_CPU_BIND": settings.BIND.read,  # read by Native.bind_team, once per process
    "RLX_CPU_LAYOUT": settings.LAYOUT.read,  # read by layout.enabled, once per compile
    "RLX_CPU_ANY_SIZE": settings.ANY_SIZE.read,  # read by anysize.any_size_executable, once per graph
    "RLX_CPU_SWISH": settings.SWISH.read,  # read by swish.post_op, per fused convolution with a SiLU
    "RLX_CPU_BF16": settings.BF16.read,  # read by bf16_units.pays, per bf16 compile
}


def test_the_backend_declares_its_twelve_variables() -> None:
    names = [s.name for s in CpuBackend().settings()]
    assert names == ["RLX_CPU_BLAS", "RLX_CPU_NATIVE", "RLX_CPU_GEMM", "RLX_CPU_CONV", "RLX_CPU_BIND", "RLX_CPU_ONEDNN",
                     "RLX_CPU_LAYOUT", "RLX_CPU_SWISH", "RLX_CPU_BF16", "RLX_CPU_POOL_MB", "RLX_CPU_ANY_SIZE",
                     "RLX_CPU_PER_IMAGE"]
    assert all(isinstance(s, rlx.plugin.Setting) for s in CpuBackend().settings())


@pytest.mark.parametrize("var", sorted(READERS))
def test_garbage_is_a_config_error_naming_variable_value_and_accepted(monkeypatch: pytest.MonkeyPatch,
                                                                      var: str) -> None:
    monkeypatch.setenv(var, "garbage")
    with pytest.raises(ConfigError) as info:
        READERS[var]()
    setting = next(s for s in settings.SETTINGS if s.name == var)
    assert str(info.value) == f"{var}: 'garbage' is not accepted; expected one of {setting.accepted}"


@pytest.mark.parametrize(("var", "value", "expected"), [
    ("RLX_CPU_GEMM", None, "auto"), ("RLX_CPU_GEMM", " Native ", "native"), ("RLX_CPU_GEMM", "blas", "blas"),
    ("RLX_CPU_CONV", None, "auto"), ("RLX_CPU_CONV", "IM2COL", "im2col"), ("RLX_CPU_CONV", "implicit", "implicit"),
    ("RLX_CPU_NATIVE", None, True), ("RLX_CPU_NATIVE", "numpy", False), ("RLX_CPU_NATIVE", "off", False),
    ("RLX_CPU_NATIVE", "on", True), ("RLX_CPU_BLAS", None, True), ("RLX_CPU_BLAS", "openblas", False),
    ("RLX_CPU_BLAS", "0", False), ("RLX_CPU_BLAS", "MKL", True), ("RLX_CPU_BIND", None, True),
    ("RLX_CPU_BIND", "0", False), ("RLX_CPU_BIND", "", True),
])
def test_the_accepted_words_mean_what_they_meant(monkeypatch: pytest.MonkeyPatch, var: str, value: str | None,
                                                 expected: object) -> None:
    if value is None:
        monkeypatch.delenv(var, raising=False)
    else:
        monkeypatch.setenv(var, value)
    assert READERS[var]() == expected


# ----------------------------------------------------------------------------- NaN and Inf: IEEE, quietly
def _graph(op: str) -> rlx.Graph:
    g = rlx.Graph(op)
    x = g.input("x", (1, 8))
    if op in ("add", "sub", "mul", "div", "pow", "maximum", "minimum"):
        y = getattr(g, op)(x, g.input("z", (1, 8)))
    elif op == "softmax":
        y = g.softmax(x, axis=-1)
    elif op == "layer_norm":
        y = g.layer_norm(x, g.param("s", np.ones(8, np.float32)), g.param("b", np.zeros(8, np.float32)))
    elif op == "matmul":
        y = g.matmul(x, g.param("w", np.ones((8, 3), np.float32)))
    elif op == "chain":
        y = g.mul(g.exp(g.add(x, x)), g.tanh(x))
    elif op.startswith("reduce_"):
        y = getattr(g, op)(x, axes=-1)
    else:
        y = getattr(g, op)(x)
    g.set_outputs([y])
    return g


OPS = ("exp", "log", "sqrt", "rsqrt", "erf", "tanh", "sigmoid", "gelu", "neg", "add", "sub", "mul", "div", "pow",
       "maximum", "minimum", "softmax", "layer_norm", "reduce_sum", "reduce_max", "reduce_mean", "matmul", "chain")


@pytest.mark.parametrize("kernels", ["native", "numpy"])
def test_nan_and_inf_give_ieee_results_without_runtime_warnings(monkeypatch: pytest.MonkeyPatch,
                                                                kernels: str) -> None:
    monkeypatch.setenv("RLX_CPU_NATIVE", "1" if kernels == "native" else "0")
    monkeypatch.setenv("RLX_CPU_BLAS", "numpy")
    backend = CpuBackend()
    x = np.array([[np.nan, np.inf, -np.inf, 0.0, -1.0, 1.0, 1e30, -0.0]], np.float32)
    for op in OPS:
        g = _graph(op).freeze()
        exe = backend.compile(g, rlx.CompileOptions(device="cpu"))
        feeds = {"x": x, "z": x[:, ::-1].copy()} if len(g.inputs) == 2 else {"x": x}
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            out = exe.run(feeds)[0]
        assert not np.isfinite(out).all(), op  # NaN or Inf came through, as IEEE says


def test_numpy_s_own_settings_are_left_alone() -> None:
    """Only rlx-cpu's plan runs quietly: the caller's numpy still warns."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(RuntimeWarning):
            np.log(np.zeros(1, np.float32))
