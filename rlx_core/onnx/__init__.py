"""ONNX import: ``rlx_core.onnx.load(model) -> Graph`` (extra ``rlx-core[onnx]``).

Importing this package is cheap: the ``onnx`` package is imported by ``load`` and
``list_inputs``, so ``import rlx_core`` works without it. See ``docs/onnx.md`` for the
supported ops, how symbolic dims are bound, what is folded at import and the limits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ModelError

if TYPE_CHECKING:
    from ..ir import Graph
    from ._loader import InputSpec

__all__ = ["DEFAULT_MAX_TENSOR_BYTES", "load", "list_inputs", "supported_ops"]

#: The default of ``max_tensor_bytes``: no single tensor of a model may declare more.
DEFAULT_MAX_TENSOR_BYTES = 4 << 30

_MISSING = "ONNX import needs the onnx package: pip install 'rlx-core[onnx]'"


def _impl() -> Any:
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise ModelError(_MISSING) from None
    from . import _loader

    return _loader


def load(model: Any, *, dims: Mapping[str, int] | None = None, max_tensor_bytes: int = DEFAULT_MAX_TENSOR_BYTES,
         name: str | None = None, values: Mapping[str, Any] | None = None) -> Graph:
    """Read an ONNX model into a ``Graph``.

    ``model`` is a path (``str`` or ``os.PathLike``), the model's bytes, or an
    ``onnx.ModelProto``. Initializers become params named as in the file (except those
    read only as shapes, axes or indices); graph inputs become inputs; the outputs keep
    their ONNX names (``graph.output_names()``).

    Symbolic input dims (an ONNX ``dim_param``, or a dim with no value) stay symbolic
    unless ``dims`` binds them: the graph then accepts any sizes at run time (``cg.run``
    binds them from the inputs and compiles once per set of sizes), each dim a symbol
    named after its ``dim_param`` (``<input>_<axis>`` for an unnamed one). ``dims`` binds
    them at load, giving a static graph: by ``dim_param`` (``{"batch": 8}``) or by
    ``"<input>:<axis>"`` (``{"x:0": 8}``, also for dims with no name); the second wins.
    ``max_tensor_bytes`` bounds every tensor the model declares or makes at import
    (checked before reading it). ``name`` names the graph (default: the ONNX graph's).

    A model that computes a shape, axes, pads, scales or a count from the *values* of
    small inputs (Reshape's ``shape`` or Resize's ``sizes`` fed at run time) loads as a
    ``ValueDependentGraph``: it is built, placed and compiled at its first run, and again
    for each new set of those values (kept in a small LRU). ``values`` (input name ->
    array) binds such inputs at load instead: they become constants, and the graph no
    longer takes them.

    A model whose output sizes depend on the data (``NonZero``, ``Unique``,
    ``NonMaxSuppression``), or that computes a shape, count or condition from data it
    makes, loads as a ``StagedGraph`` (``rlx_core.ir.staged``): the part before runs
    compiled, those ops on the host, and the part after is built and compiled for the
    sizes they made. ``RoiAlign``, ``GridSample`` and a ``TopK`` too large to unroll run
    on the host the same way; a ``Loop`` that exits on data runs from the host, its body
    compiled once and run per iteration.

    Raises ``ModelError`` naming the file and the node, tensor or input at fault.
    """
    impl = _impl()
    checked, bound, free = impl.prepare(model, dims=dims, max_tensor_bytes=max_tensor_bytes, name=name, values=values)
    from ._staged import load_any

    return load_any(checked, bound, free)


def list_inputs(model: Any) -> list[InputSpec]:
    """The model's inputs as ``(name, shape, dtype)``, without converting it.

    Each symbolic dim appears as the ``dims`` key that binds it: its ``dim_param``, or
    ``"<input>:<axis>"`` when it has none. A CLI or a batch predictor uses this to bind
    the batch dim or to make random inputs.
    """
    return _impl().list_inputs(model)


def supported_ops() -> list[str]:
    """The ONNX op types (default domain) that ``load`` reads, sorted: those converted to
    rlx ops and those run on the host between compiled stages (``NonZero``, ...)."""
    impl = _impl()
    return sorted({*impl.CONVERTERS, *impl.HOST_OPS})
