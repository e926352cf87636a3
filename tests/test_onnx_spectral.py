"""DFT, STFT and MelWeightMatrix (rlx_core/onnx/_ops_spectral.py), against numpy's FFT and
ONNX's reference evaluator: real and complex signals, any axis, dft_length padding and
truncation, inverse, onesided (RFFT and IRFFT), windows, and the forms refused by name."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")

from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from test_onnx_support import init, make_model, vi

import rlx_core as rlx
from rlx_core import onnx as rlx_onnx
from rlx_core.errors import ModelError

RNG = np.random.default_rng(42)


def _run(model: Any, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return rlx.compile(rlx_onnx.load(model), device="cpu").run(feeds)[0]


def _pairs(z: np.ndarray) -> np.ndarray:
    """A complex array in ONNX's layout: (real, imag) on a trailing axis."""
    return np.stack([z.real, z.imag], axis=-1)


def _signal(shape: tuple[int, ...], complex_in: bool, dtype: str = "float32") -> np.ndarray:
    return RNG.standard_normal((*shape, 2 if complex_in else 1)).astype(dtype)


def _complex(x: np.ndarray) -> np.ndarray:
    return x[..., 0].astype(np.float64) + (1j * x[..., 1] if x.shape[-1] == 2 else 0)


def _dft_model(x: np.ndarray, axis: int, opset: int, n: int | None = None, **attrs: int) -> Any:
    inputs, inits = ["x", "n" if n is not None else ""], [] if n is None else [init("n", np.array(n, np.int64))]
    if opset >= 20:
        inputs.append("axis")
        inits.append(init("axis", np.array(axis, np.int64)))
    else:
        attrs["axis"] = axis
    node = helper.make_node("DFT", inputs, ["y"], **attrs)
    return make_model([node], [vi("x", x.dtype.name, list(x.shape))], [vi("y", x.dtype.name, None)], inits,
                      opset=opset)


def _check(model: Any, feeds: dict[str, np.ndarray], want: np.ndarray, atol: float = 1e-4) -> None:
    """rlx's output matches ``want`` (numpy, in float64) and ONNX's reference evaluator."""
    got = _run(model, feeds)
    assert got.shape == want.shape and got.dtype == next(iter(feeds.values())).dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol)
    np.testing.assert_allclose(got, ReferenceEvaluator(model).run(None, feeds)[0], rtol=1e-4, atol=atol)


@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize("complex_in", [False, True])
@pytest.mark.parametrize(("shape", "axis"), [((6,), 0), ((2, 8), 1), ((2, 5, 3), 1), ((2, 5, 3), -3), ((3, 6, 4), 2)])
def test_dft_forward(opset: int, complex_in: bool, shape: tuple[int, ...], axis: int) -> None:
    x = _signal(shape, complex_in)
    want = _pairs(np.fft.fft(_complex(x), axis=axis % (len(shape) + 1)))  # (x has the pair axis too)
    _check(_dft_model(x, axis, opset), {"x": x}, want)


@pytest.mark.parametrize("complex_in", [False, True])
@pytest.mark.parametrize("n", [3, 6, 11])  # truncate, keep, zero-pad the 6 points
def test_dft_length_pads_and_truncates(complex_in: bool, n: int) -> None:
    x = _signal((2, 6, 3), complex_in)
    want = _pairs(np.fft.fft(_complex(x), n=n, axis=1))
    _check(_dft_model(x, 1, 17, n=n), {"x": x}, want)


@pytest.mark.parametrize("complex_in", [False, True])
@pytest.mark.parametrize("n", [None, 4, 9])
def test_dft_inverse(complex_in: bool, n: int | None) -> None:
    x = _signal((2, 3, 7), complex_in)
    want = _pairs(np.fft.ifft(_complex(x), n=n, axis=2))
    _check(_dft_model(x, -2, 20, n=n, inverse=1), {"x": x}, want)


@pytest.mark.parametrize("n", [None, 5, 8, 12])
def test_dft_onesided_is_rfft(n: int | None) -> None:
    x = _signal((2, 8, 3), False)
    want = _pairs(np.fft.rfft(_complex(x).real, n=n, axis=1))
    _check(_dft_model(x, 1, 17, n=n, onesided=1), {"x": x}, want)


@pytest.mark.parametrize("n", [None, 7, 9, 16])  # default 2*(5-1), odd, truncating bins, padding them
def test_dft_onesided_inverse_is_irfft(n: int | None) -> None:
    x = _signal((3, 5), True)
    want = np.fft.irfft(_complex(x), n=n, axis=1)[..., None]
    _check(_dft_model(x, 1, 20, n=n, onesided=1, inverse=1), {"x": x}, want)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_dft_other_float_dtypes(dtype: str) -> None:
    x = _signal((2, 16), False, dtype)
    want = _pairs(np.fft.fft(_complex(x), axis=1))
    got = _run(_dft_model(x, 1, 17), {"x": x})
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got, want, rtol=1e-2 if dtype == "float16" else 1e-12,
                               atol=2e-2 if dtype == "float16" else 1e-12)


def _stft_model(x: np.ndarray, step: int, window: np.ndarray | None, length: int | None, **attrs: int) -> Any:
    inputs = ["x", "step", "" if window is None else "w", "" if length is None else "len"]
    inits = [init("step", np.array(step, np.int64))]
    if length is not None:
        inits.append(init("len", np.array(length, np.int64)))
    graph_inputs = [vi("x", "float32", list(x.shape))]
    if window is not None:
        graph_inputs.append(vi("w", "float32", list(window.shape)))
    node = helper.make_node("STFT", inputs, ["y"], **attrs)
    while node.input and not node.input[-1]:
        node.input.pop()
    return make_model([node], graph_inputs, [vi("y", "float32", None)], inits)


def _stft_want(x: np.ndarray, step: int, window: np.ndarray, onesided: bool) -> np.ndarray:
    length = len(window)
    frames = 1 + (x.shape[1] - length) // step
    framed = np.stack([_complex(x)[:, f * step:f * step + length] for f in range(frames)], axis=1) * window
    return _pairs(np.fft.rfft(framed.real, axis=2) if onesided else np.fft.fft(framed, axis=2))


@pytest.mark.parametrize(("step", "length", "with_window"), [(4, 8, True), (3, 8, False), (5, None, True),
                                                             (2, 7, True)])
def test_stft(step: int, length: int | None, with_window: bool) -> None:
    x = _signal((2, 30), False)
    size = 8 if length is None else length
    window = np.hanning(size).astype(np.float32) if with_window else None
    model = _stft_model(x, step, window, length)
    feeds = {"x": x} if window is None else {"x": x, "w": window}
    _check(model, feeds, _stft_want(x, step, np.ones(size) if window is None else window, True))


def test_stft_of_the_whole_signal_when_no_length_is_given() -> None:
    x = _signal((1, 16), False)
    _check(_stft_model(x, 4, None, None), {"x": x}, _stft_want(x, 4, np.ones(16), True))


def test_stft_complex_two_sided() -> None:
    x = _signal((2, 20), True)
    window = np.hamming(6).astype(np.float32)
    model = _stft_model(x, 3, window, None, onesided=0)
    _check(model, {"x": x, "w": window}, _stft_want(x, 3, window, False))


@pytest.mark.parametrize(("args", "out"), [((8, 512, 16000, 0.0, 8000.0), TensorProto.FLOAT),
                                           ((5, 256, 8000, 50.0, 3000.0), TensorProto.DOUBLE),
                                           ((3, 64, 16000, 100.0, 100.0), TensorProto.FLOAT)])
def test_mel_weight_matrix(args: tuple[Any, ...], out: int) -> None:
    names = ["mels", "dft", "rate", "low", "high"]
    dtypes = [np.int64, np.int64, np.int64, np.float32, np.float32]
    inits = [init(n, np.array(v, d)) for n, v, d in zip(names, args, dtypes)]
    node = helper.make_node("MelWeightMatrix", names, ["m"], output_datatype=out)
    model = make_model([node], [], [vi("m", "float64" if out == TensorProto.DOUBLE else "float32", None)], inits)
    graph = rlx_onnx.load(model)
    got = rlx.compile(graph, device="cpu").run({})[0]
    want = ReferenceEvaluator(model).run(None, {})[0]
    assert got.shape == (args[1] // 2 + 1, args[0]) and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def _refused(model: Any, match: str) -> None:
    with pytest.raises(ModelError, match=match) as info:
        rlx_onnx.load(model)
    assert isinstance(info.value, rlx.RlxError)


def test_forms_the_spec_refuses_are_refused_by_name() -> None:
    x = _signal((2, 6), True)
    _refused(_dft_model(x, 1, 17, onesided=1), r"\(DFT\).*onesided=1 takes a real input")
    _refused(_dft_model(_signal((2, 6), False), 1, 17, onesided=1, inverse=1), r"\(DFT\).*complex one")
    _refused(_dft_model(x, 2, 17), r"\(DFT\).*axis 2 is out of range")
    _refused(_dft_model(x, 1, 17, n=0), r"\(DFT\).*dft_length must be >= 1")
    _refused(_stft_model(x, 2, None, 4), r"\(STFT\).*onesided=1 \(the default\) is not possible")
    _refused(_stft_model(_signal((2, 6), False), 2, None, 9), r"\(STFT\).*frame_length must be between 1")
    high = make_model([helper.make_node("MelWeightMatrix", ["a", "b", "c", "d", "e"], ["m"])], [],
                      [vi("m", "float32", None)],
                      [init(n, np.array(v, d)) for n, v, d in zip("abcde", (4, 64, 8000, 0.0, 12000.0),
                                                                  (np.int64,) * 3 + (np.float32,) * 2)])
    _refused(high, r"\(MelWeightMatrix\).*lies past the last")
