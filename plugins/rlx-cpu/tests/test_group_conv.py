"""rlx's grouped convolution kernel (``rlx_group_conv``): few channels a group, as in
ResNeXt and RegNet. Where it applies it runs (spied on), agrees with the float64
reference on partial channel blocks, row tails, both column strides and 5x5 windows, and
its numpy fallback (a caller's array it cannot take) does too; where it does not apply
(dilation, wide groups) the convolution still comes out right. Rows narrower than a
vector (7x7 planes) and rows wide enough for its 16-float vectors (where the AVX-512
clones run) are cases of their own."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import rlx_core as rlx
from rlx_core import reference
from rlx_core.backends.registry import Registry
from rlx_core.ir import Graph
from rlx_core.run.session import CompiledGraph
from rlx_cpu import CpuBackend, native, native_nn

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
    "dilation 2: not taken": ((1, 8, 12, 12), (8, 4, 3, 3), {"padding": 2, "dilation": 2, "groups": 2}, True, False),
    "column stride 3: not taken": ((1, 8, 30, 30), (8, 4, 3, 3), {"stride": 3, "groups": 2}, True, False),
}


def rand(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(F32)


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
    """The grouped kernel's calls by plans compiled from here on."""
    ran: list[tuple[Any, ...]] = []
    real = native_lib.group_conv
    monkeypatch.setattr(native_lib, "group_conv", lambda *a: (ran.append(a), real(*a))[1])
    return ran


@pytest.mark.parametrize("case", list(CASES))
def test_grouped_convolutions_agree_with_the_reference(calls: list[tuple[Any, ...]], case: str) -> None:
    g = graph(case)
    x = rand(CASES[case][0], 3)
    (got,) = compile_cpu(g).run({"x": x})
    assert bool(calls) is CASES[case][4], f"grouped kernel calls: {len(calls)}"
    np.testing.assert_allclose(got, reference.evaluate(g, {"x": x})[0], rtol=1e-5, atol=1e-5)


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
    monkeypatch.setattr(native_nn, "GROUP_CONV_MAX_CG", 2)
    case = "4 channels a group, rows of 16"
    g = graph(case)
    x = rand(CASES[case][0], 5)
    (got,) = compile_cpu(g).run({"x": x})
    assert not calls
    np.testing.assert_allclose(got, reference.evaluate(g, {"x": x})[0], rtol=1e-5, atol=1e-5)
