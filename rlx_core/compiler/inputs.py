"""Run-time inputs: validation before any work, and seeded random inputs for tools.

Validation is on every run's hot path, so the common case (a numpy array of the right
shape and dtype) costs a type check and two comparisons per input.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import InputError
from ..ir import Graph, Node
from ..ir.dtypes import is_int
from ..ir.specialize import REPRESENTATIVE_SIZES, representative
from ..ir.symbolic import Sym, evaluate
from ..ir.valued import RunTimeGraph

__all__ = ["InputSpec", "input_specs", "validate_inputs", "as_array", "random_inputs", "check_param_value"]


class InputSpec:
    """What one graph input expects."""

    __slots__ = ("dtype", "name", "shape", "symbolic")

    def __init__(self, node: Node) -> None:
        self.name = node.name
        self.shape = node.shape
        self.dtype = np.dtype(node.dtype)
        # A symbolic dim (``"batch"``) takes any size here; that the sizes agree with one
        # another is ``Graph.bind``'s to check, with the graph's constraints.
        self.symbolic = any(type(d) is not int for d in node.shape)

    def fits(self, shape: tuple[int, ...]) -> bool:
        """Whether ``shape`` has this input's rank and its fixed dims."""
        if not self.symbolic:
            return shape == self.shape
        return len(shape) == len(self.shape) and all(type(d) is not int or d == s for d, s in zip(self.shape, shape))


def input_specs(graph: Graph) -> tuple[InputSpec, ...]:
    return tuple(InputSpec(graph.node(i)) for i in graph.inputs)


def as_array(value: Any, what: str) -> np.ndarray:
    """An ndarray view of ``value`` (``__array__`` or ``__dlpack__``), never a silent cast."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__dlpack__"):
        try:
            return np.from_dlpack(value)
        except (TypeError, RuntimeError, BufferError, ValueError):
            pass  # e.g. a device array numpy cannot view; __array__ may still copy it to host
    if hasattr(value, "__array__") or isinstance(value, (np.generic, int, float, bool, list, tuple)):
        try:
            return np.asarray(value)
        except Exception as exc:
            raise InputError(f"{what}: cannot convert {type(value).__name__} to an array: {exc}") from None
    raise InputError(f"{what}: expected an array (numpy, __array__ or __dlpack__), got {type(value).__name__}")


def _device_array(value: Any) -> tuple[tuple[int, ...], np.dtype] | None:
    """``(shape, dtype)`` of an array that lives on a device (``__cuda_array_interface__``
    or ``__dlpack__`` with ``shape`` and ``dtype``: CuPy, torch, JAX), else ``None``."""
    if not (hasattr(value, "__cuda_array_interface__") or hasattr(value, "__dlpack__")):
        return None
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return None
    try:
        dt = np.dtype(dtype)
    except TypeError:  # torch.float32 and friends: the numpy name after the dot
        try:
            dt = np.dtype(str(dtype).rsplit(".", 1)[-1])
        except TypeError:
            return None
    return tuple(int(d) for d in shape), dt


def validate_inputs(specs: Sequence[InputSpec], inputs: Mapping[str, Any],
                    device_arrays: bool = False) -> dict[str, Any]:
    """Check names, shapes and dtypes; return ``{name: ndarray}`` or raise ``InputError``.

    With ``device_arrays`` (the executable said ``accepts_device_inputs``), an array that
    lives on a device is checked by its ``shape`` and ``dtype`` and passed on as it is,
    so a CuPy or torch CUDA tensor reaches the backend without a trip through the host.

    The fast path (a plain dict holding exactly the graph's inputs as numpy arrays of the
    right shapes and dtypes) returns ``inputs`` itself, unchanged: that is every run of a
    well-behaved caller, and it costs a few hundred nanoseconds less than building a new
    dict (the ``Mapping`` ABC check alone is ~150 ns). Anything else takes the full path,
    which converts, and names what is wrong.
    """
    if type(inputs) is dict and len(inputs) == len(specs):
        for spec in specs:
            arr = inputs.get(spec.name)
            if type(arr) is not np.ndarray or arr.shape != spec.shape or (
                arr.dtype is not spec.dtype and arr.dtype != spec.dtype
            ):
                break
        else:
            return inputs
    if not isinstance(inputs, Mapping):
        raise InputError(f"inputs must be a mapping of input name to array, got {type(inputs).__name__}")
    out: dict[str, Any] = {}
    for spec in specs:
        try:
            value = inputs[spec.name]
        except KeyError:
            missing = [s.name for s in specs if s.name not in inputs]
            names = {s.name for s in specs}
            unknown = [k for k in inputs if k not in names]  # a misspelt name is both: say so
            raise InputError(
                f"missing input(s) {', '.join(repr(m) for m in missing)}"
                + (f" and unknown input(s) {', '.join(repr(u) for u in unknown)}" if unknown else "")
                + "; the graph takes " + ", ".join(f"{s.name!r} {s.shape} {s.dtype}" for s in specs)
            ) from None
        dev = None if type(value) is np.ndarray or not device_arrays else _device_array(value)
        arr = value if type(value) is np.ndarray or dev is not None else as_array(value, f"input {spec.name!r}")
        shape, dtype = dev if dev is not None else (arr.shape, arr.dtype)
        if dtype != spec.dtype or (shape != spec.shape and not spec.fits(shape)):
            if dtype != spec.dtype:
                raise InputError(
                    f"input {spec.name!r}: expected dtype {spec.dtype}, got {dtype} "
                    f"(rlx never casts silently; convert it with .astype('{spec.dtype}'))"
                )
            raise InputError(f"input {spec.name!r}: expected shape {spec.shape}, got {shape}")
        out[spec.name] = arr
    if len(inputs) != len(out):
        unknown = [k for k in inputs if k not in out]
        raise InputError(
            f"unknown input(s) {', '.join(repr(u) for u in unknown)}; the graph takes "
            + (", ".join(repr(s.name) for s in specs) or "no inputs")
        )
    return out


def check_param_value(graph: Graph, name: str, value: Any) -> tuple[Node, np.ndarray]:
    """Validate a ``set_param`` value: an existing param, same shape and dtype."""
    node = next((graph.node(i) for i in graph.params if graph.node(i).name == name), None)
    if node is None:
        known = ", ".join(repr(graph.node(i).name) for i in graph.params) or "none"
        raise InputError(f"set_param: graph {graph.name!r} has no param {name!r}; its params: {known}")
    arr = as_array(value, f"param {name!r}")
    if arr.dtype.name != node.dtype:
        raise InputError(f"set_param {name!r}: expected dtype {node.dtype}, got {arr.dtype} (no silent casts)")
    if arr.shape != node.shape:
        raise InputError(f"set_param {name!r}: expected shape {node.shape}, got {arr.shape}")
    frozen = np.array(arr, copy=True)
    frozen.flags.writeable = False
    return node, frozen


def random_inputs(graph: Graph, seed: int = 0,
                  given: Mapping[str, Sequence[int]] | None = None) -> dict[str, np.ndarray]:
    """Seeded inputs matching ``graph``: floats in [-1, 1), ints in [0, 8), random bools.

    Int inputs stay small so that they are valid indices for typical gathers. A symbolic
    graph gets inputs of its representative size (``ir.specialize.representative``), except
    for the symbols that the shapes of inputs already ``given`` (name -> shape) fix, so
    that the made-up inputs fit the given ones. A ``ValueDependentGraph`` gets none for its
    value inputs (made-up shapes or axes would not fit the model: an ``InputError`` asks for
    them), and its other symbols take the representative size where ``given`` leaves them.
    """
    fixed: dict[str, int] = {}
    for i in graph.inputs:
        node = graph.node(i)
        shape = (given or {}).get(node.name)
        if shape is not None and len(shape) == len(node.shape):
            fixed.update({d.name: int(n) for d, n in zip(node.shape, shape) if isinstance(d, Sym) and d.name})
    if isinstance(graph, RunTimeGraph):  # no body before it runs: inputs from its declared shapes
        absent = [v for v in graph.value_inputs if v not in (given or {})]
        if absent:
            raise InputError(f"{graph.needs()}; give the values of {', '.join(repr(v) for v in absent)} "
                             f"(--input {absent[0]}=FILE.npy): made-up values would not fit the model")
        sizes = {**dict.fromkeys(graph.symbols, REPRESENTATIVE_SIZES[0]), **fixed}
        specs = [(n.name, tuple(evaluate(d, sizes) for d in n.shape), n.dtype) for n in map(graph.node, graph.inputs)]
    else:
        if graph.is_symbolic:
            rep, bindings = representative(graph)
            graph = graph.specialize({**bindings, **fixed}) if fixed else rep
        specs = [(n.name, n.shape, n.dtype) for n in map(graph.node, graph.inputs)]
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape, dtype in specs:
        if dtype == "bool":
            out[name] = rng.random(shape) < 0.5
        elif is_int(dtype) or dtype in ("int4", "uint4", "int2", "uint2"):
            out[name] = rng.integers(0, 4 if dtype.endswith("2") else 8, shape).astype(dtype)
        else:
            out[name] = rng.uniform(-1, 1, shape).astype(dtype)
    return out
