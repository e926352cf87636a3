"""rlx's grouped convolution kernel (``rlx_group_conv``): few channels a group, as in
ResNeXt and RegNet. Where it applies it runs (spied on), agrees with the float64
reference on partial channel blocks, row tails, both column strides and 5x5 windows, and
its numpy fallback (a caller's array it cannot take) does too; where it does not apply
(dilation, wide groups) the convolution still comes out right. Rows narrower than a
vector (7x7 planes) and rows wide enough for its 16-float vectors (where the AVX-512
clones run) are cases of their own, and so are groups of 16, 32 and 48 output channels,
which run with the channels in the lanes (``rlx_group_conv_lanes``) where the AVX-512
clones run."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_core.backends.registry import Registry
from rlx_core.ir import Graph
from rlx_core.run.session import CompiledGraph
from rlx_cpu import CpuBackend, grouped_conv, native

F32 = np.float32

#: name -> (x shape, w shape, conv2d kwargs, with a bias, whether the grouped kernel takes it)
CASES: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict[str, Any], bool, bool]] = {
    "4 channels a group, rows of 16": ((1, 8, 16, 16), (8, 4, 3, 3), {"padding": 1, "groups": 2}, True, True),
    "3 outputs a group (a partial block of 4), stride 2, two images": ((2, 6, 13, 17), (9, 2, 3, 3),
                                                                       {"stride": 2, "padding": 1, "groups": 3},
                                                                       True, True),
    "5x5, 6 outputs a group, rows of 9 (the last 8 again)": ((1, 8, 9, 9), (12, 4, 5, 5), {"padding": 2, "groups": 2},
                                                             False, True),
    "1 channel a group, 2 outputs, no padding, stride 2": ((1, 4, 20, 21), (8, 1, 3, 3), {"stride": 2, "groups": 4},
                                                           True, True),
    "strides (2, 1), asymmetric padding": ((1, 8, 12, 12), (8, 2, 3, 3),
                                           {"stride": (2, 1), "padding": (1, 0, 0, 1), "groups": 4}, True, True),
    "rows of 7 (one vector over a padded row)": ((1, 8, 7, 7), (8, 4, 3, 3), {"padding": 1, "groups": 2}, True, True),
    "rows of 7 at stride 2, 16 channels a group": ((1, 32, 14, 14), (32, 16, 3, 3),
                                                   {"stride": 2, "padding": 1, "groups": 2}, True, True),
    "rows of 2 and 1": ((1, 6, 3, 2), (6, 3, 3, 3), {"padding": (1, 1, 1, 0), "groups": 2}, False, True),
    "rows of 14, 13 of them, 3 outputs a group": ((1, 6, 13, 14), (9, 2, 3, 3), {"padding": 1, "groups": 3},
                                                  True, True),
    "rows of 12 at stride 2, 5x5": ((2, 8, 24, 24), (8, 4, 5, 5), {"stride": 2, "padding": 2, "groups": 2},
                                    True, True),
    "rows of 59: 32 + 16 wide, 8, then the last 8 again": ((1, 16, 5, 59), (8, 8, 3, 3),
                                                           {"padding": 1, "groups": 2}, True, True),
    "16 outputs a group, rows of 7 (the lanes on AVX-512)": ((1, 32, 7, 7), (32, 16, 3, 3),
                                                               {"padding": 1, "groups": 2}, True, True),
    "32 outputs a group, stride 2, rows of 13, two images": ((2, 64, 26, 26), (64, 32, 3, 3),
                                                             {"stride": 2, "padding": 1, "groups": 2}, True, True),
    "16 outputs a group, 5x5, rows of 30 (three blocks of 10), no bias": ((1, 32, 12, 30), (32, 16, 5, 5),
                                                                         {"padding": 2, "groups": 2}, False, True),
    "48 outputs a group, strides (2, 1), asymmetric padding": ((1, 96, 11, 11), (96, 48, 3, 3),
                                                               {"stride": (2, 1), "padding": (1, 0, 0, 1), "groups": 2},
                                                               True, True),
    "16 outputs of 8 inputs a group, rows of 25 (13 + 12)": ((1, 16, 9, 25), (32, 8, 3, 3),
                                                             {"padding": 1, "groups": 2}, True, True),
    "8 outputs a group (one block of 8), stride 2": ((1, 16, 15, 15), (16, 8, 3, 3),
                                                     {"stride": 2, "padding": 1, "groups": 2}, True, True),
    "12 outputs a group (8, then 4 of a block), rows of 20": ((1, 8, 6, 20), (24, 4, 3, 3),
                                                              {"padding": 1, "groups": 2}, False, True),
    "24 outputs a group (three blocks of 8, not the lanes), rows of 7": ((1, 48, 7, 7), (48, 24, 3, 3),
                                                                         {"padding": 1, "groups": 2}, True, True),
    "dilation 2: not taken": ((1, 8, 12, 12), (8, 4, 3, 3), {"padding": 2, "dilation": 2, "groups": 2}, True, False),
    "column stride 3: not taken": ((1, 8, 30, 30), (8, 4, 3, 3), {"stride": 3, "groups": 2}, True, False),
}


def rand(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(F32)


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    """float32 sums of up to 432 products against float64's: within 1e-5 of the output's
    largest magnitude (outputs of ~16 differ in their 6th digit)."""
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def graph(case: str) -> Graph:
    xs, ws, kw, bias, _ = CASES[case]
    g = Graph("grouped")
    b = g.param("b", rand((ws[0],), 2)) if bias else None
    g.set_outputs([g.relu(g.conv2d(g.input("x", xs, "float32"), g.param("w", rand(ws, 1)), b, **kw))])
    return g


def compile_cpu(g: Graph) -> CompiledGraph:
    reg = Registry(entry_points=[], environ={})
    reg.register(CpuBackend())
    return rlx.compile(g, device="cpu", registry=reg)


@pytest.fixture
def calls(native_lib: native.Native, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The grouped kernels' calls by plans compiled from here on: ``(kernel name, *args)``,
    the row kernel's (``group_conv``) and the lanes kernel's (``group_conv_lanes``)."""
    ran: list[tuple[Any, ...]] = []
    for name in ("group_conv", "group_conv_lanes"):
        real = getattr(native_lib, name)
        monkeypatch.setattr(native_lib, name, lambda *a, name=name, real=real: (ran.append((name, *a)), real(*a))[1])
    return ran


def lanes_expected(native_lib: native.Native, w_shape: tuple[int, ...], groups: int) -> bool:
    """Whether the lanes kernel takes a grouped convolution of weights ``w_shape``: groups of
    a multiple of 16 output channels, on a host whose AVX-512 clones run."""
    return native_lib.gemm_avx512 and (w_shape[0] // groups) % grouped_conv.GROUP_CONV_LANES == 0


@pytest.mark.parametrize("case", list(CASES))
def test_grouped_convolutions_agree_with_the_reference(native_lib: native.Native, calls: list[tuple[Any, ...]],
                                                       case: str) -> None:
    g = graph(case)
    x = rand(CASES[case][0], 3)
    (got,) = compile_cpu(g).run({"x": x})
    assert bool(calls) is CASES[case][4], f"grouped kernel calls: {len(calls)}"
    if calls:
        lanes = lanes_expected(native_lib, CASES[case][1], CASES[case][2]["groups"])
        assert {c[0] for c in calls} == {"group_conv_lanes" if lanes else "group_conv"}
    assert_close(got, reference.evaluate(g, {"x": x})[0])


def test_the_lanes_kernel_takes_any_column_stride_and_repacks_after_set_param(
    native_lib: native.Native, calls: list[tuple[Any, ...]]
) -> None:
    """Groups of 16 at column stride 3 (the row kernel takes 1 and 2 only) run in the
    lanes on AVX-512; the weights it packed once are packed again when set_param changes
    them."""
    g = Graph("grouped")
    w = g.param("w", rand((32, 16, 3, 3), 1))
    g.set_outputs([g.conv2d(g.input("x", (1, 32, 20, 20), "float32"), w, g.param("b", rand((32,), 2)), stride=3,
                            padding=1, groups=2)])
    x = rand((1, 32, 20, 20), 3)
    cg = compile_cpu(g)
    (got,) = cg.run({"x": x})
    assert [c[0] for c in calls] == (["group_conv_lanes"] if native_lib.gemm_avx512 else [])
    assert_close(got, reference.evaluate(g, {"x": x})[0])
    w2 = rand((32, 16, 3, 3), 7)
    cg.set_param("w", w2)
    (got,) = cg.run({"x": x})
    assert_close(got, reference.evaluate(g, {"x": x}, {"w": w2})[0])


def test_a_caller_array_the_kernel_cannot_take_runs_the_numpy_way(calls: list[tuple[Any, ...]]) -> None:
    """An input every other element of a caller's array: the planned call cannot take it,
    so the step's numpy fallback computes it (with the epilogue), not the kernel."""
    case = "3 outputs a group (a partial block of 4), stride 2, two images"
    g = graph(case)
    wide = rand((*CASES[case][0][:3], 2 * CASES[case][0][3]), 4)
    x = wide[..., ::2]
    (got,) = compile_cpu(g).run({"x": x})
    assert not calls
    np.testing.assert_allclose(got, reference.evaluate(g, {"x": np.ascontiguousarray(x)})[0], rtol=1e-5, atol=1e-5)


def test_wider_groups_stay_with_a_product_per_group(
    calls: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(grouped_conv, "GROUP_CONV_MAX_CG", 2)
    case = "4 channels a group, rows of 16"
    g = graph(case)
    x = rand(CASES[case][0], 5)
    (got,) = compile_cpu(g).run({"x": x})
    assert not calls
    np.testing.assert_allclose(got, reference.evaluate(g, {"x": x})[0], rtol=1e-5, atol=1e-5)
