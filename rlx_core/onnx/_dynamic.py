"""Loading a model whose input dims are left symbolic (no ``dims=`` for them).

The graph ``load`` returns then has symbolic inputs: each dim left unbound becomes a
symbol named after its ``dim_param`` (or ``<input>_<axis>`` for an unnamed one, made an
identifier), and the graph runs at any sizes. Two ways to get there:

- **Converted once** (``convert_symbolic``), when every op of the model has a converter
  exact on symbols (``SYMBOLIC_OPS``): the conversion runs with the symbols themselves,
  shape computations are carried as dims (``_symdims``) and what the model computes from
  its sizes as sized constants (``rlx_core.ir.sized``). The result is an ordinary symbolic
  ``Graph``: the compile pipeline can run on it once (``compiler/lowered_once.py``).
- **Converted per size** (a ``DeferredGraph``), when the symbolic conversion cannot carry
  the model exactly (``NotSymbolic``, or any other failure): its body is converted at a
  representative size, the first of ``REPRESENTATIVE_SIZES`` for which the model converts
  (a model may refuse some: position tables, fixed reshapes), and each set of sizes a
  compile meets is converted again with those sizes bound, so every shape computation
  folds exactly as in a static load, for every op ``load`` reads.

Memory: the model kept for converting again holds no copy of the weights that became
params (their data is dropped from it; each conversion takes the arrays the graph
already holds), only the small initializers read as shapes, axes or tables.
"""
from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
from onnx import GraphProto

from ..errors import GraphError, InputError, ModelError
from ..ir import Graph
from ..ir.deferred import DeferredGraph
from ..ir.specialize import REPRESENTATIVE_SIZES
from ..ir.symbolic import Dim, Sym, UnboundSymbolError, evaluate
from ._context import NeedsHost, NeedsValue, SpliceIf
from ._loader import Model, resolve_dims

__all__ = ["load_symbolic", "convert_symbolic", "symbol_names", "symbolic_shapes", "without_weights",
           "SYMBOLIC_OPS"]

log = logging.getLogger("rlx.onnx")

#: ONNX ops whose converters are exact on symbolic dims: every decision they take on a
#: dim is one that holds for all sizes (``dim_eq``), or they refuse (``NotSymbolic``). A
#: model holding any other op is converted at each size instead.
SYMBOLIC_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Neg", "Abs", "Exp", "Log", "Erf", "Tanh", "Sigmoid",
    "Relu", "Gelu", "Sin", "Cos", "Max", "Min", "Where", "Equal", "Less", "LessOrEqual", "Greater",
    "GreaterOrEqual", "And", "Or", "Not", "IsNaN", "Cast", "Identity", "Constant", "ConstantOfShape", "Shape",
    "Size", "Range", "Expand", "Reshape", "Transpose", "Unsqueeze", "Squeeze", "Concat", "Slice", "Gather",
    "Split", "Flatten", "MatMul", "Gemm", "Softmax", "LayerNormalization", "ReduceMean", "ReduceSum",
    "Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "BatchNormalization", "Clip", "Dropout",
    "GatherElements", "GatherND", "InstanceNormalization", "GroupNormalization", "Mod",
})


def symbol_names(keys: Sequence[str]) -> dict[str, str]:
    """A distinct identifier for each ``dims`` key: ``batch`` stays ``batch``,
    ``x:0`` becomes ``x_0``, ``2d size`` becomes ``_2d_size``."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for key in keys:
        base = re.sub(r"\W", "_", key)
        base = base if base.isidentifier() else f"_{base}"
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base}_{n}"
        taken.add(name)
        names[key] = name
    return names


def symbolic_shapes(model: Model, dims: Mapping[str, int], names: Mapping[str, str]) -> dict[str, tuple[Dim, ...]]:
    """Each input's shape with the dims ``dims`` leaves free as the symbols ``names`` gives."""
    return {input_name: tuple(Sym(names[d]) if isinstance(d, str) else d for d in shape)
            for input_name, shape in resolve_dims(model.specs, dims, model.where)}


def load_symbolic(model: Model, dims: Mapping[str, int], free: Sequence[str]) -> Graph:
    """``model`` as a graph whose ``free`` dims (``dims`` keys) are symbols; ``dims``
    binds the rest. ``ModelError`` when the model converts at none of the sizes tried."""
    names = symbol_names(free)
    graph = convert_symbolic(model, dims, free, names)
    if graph is not None:
        return graph
    shapes = symbolic_shapes(model, dims, names)

    failures: list[tuple[int, ModelError]] = []
    for trial in _trial_sizes(free):
        try:
            body = model.convert({**dims, **trial})
            break
        except (NeedsValue, NeedsHost, SpliceIf):  # no size helps: the caller builds, cuts or splices
            raise
        except ModelError as exc:
            if len(set(trial.values())) == 1:  # (the message names the equal sizes' faults)
                failures.append((next(iter(trial.values())), exc))
    else:
        listed = ", ".join(f"{k!r}" for k in free)
        if len({_sizeless(str(exc), size) for size, exc in failures}) == 1:  # one fault, whatever the size
            sizes = ", ".join(str(size) for size, _ in failures)
            detail = f"at each of {sizes}: {failures[0][1]}"
        else:
            detail = "; ".join(f"at {size}: {exc}" for size, exc in failures)
        raise ModelError(f"{model.where}: its symbolic dims ({listed}) were left unbound, and converting it failed "
                         f"at every size tried ({detail}); if the sizes are the cause, bind them "
                         "with dims=")

    kept = without_weights(model.gp, {body.node(i).name for i in body.params})
    again = model.with_graph(kept)

    def build(sizes: Mapping[str, int], params: Mapping[str, np.ndarray]) -> Graph:
        return again.convert({**dims, **{key: sizes[names[key]] for key in free}}, preloaded=params)

    at = {names[key]: size for key, size in trial.items()}
    return DeferredGraph(body, shapes, build, at, source=model.where)


#: Sizes of the sums tried when every symbol at one size does not convert.
_PART, _OTHER = 8, 16


def _trial_sizes(free: Sequence[str]) -> Iterator[dict[str, int]]:
    """Sizes to convert a model at: every symbol at each of ``REPRESENTATIVE_SIZES``, then,
    with three symbols or more, one symbol the sum of two others (16 + 8 = 24, the rest
    16). Why: a decoder step exported with a KV cache has a mask of the past and new
    tokens together (OPT's ``tp = t + p``: it slices ``cumsum(mask)[:, p:]`` for the
    positions); with every symbol one size, ``tp - p`` is 0 and no size converts."""
    for size in REPRESENTATIVE_SIZES:
        yield dict.fromkeys(free, size)
    for total in free:
        others = [k for k in free if k != total]
        for a, b in itertools.combinations(others, 2):
            yield {**dict.fromkeys(free, _OTHER), a: _OTHER, b: _PART, total: _OTHER + _PART}


def convert_symbolic(model: Model, dims: Mapping[str, int], free: Sequence[str],
                     names: Mapping[str, str]) -> Graph | None:
    """``model`` converted once with its ``free`` dims as symbols, every shape computation
    carried as dims (``_symdims``): a graph whose specializations are what converting at
    those sizes makes. ``None`` when the model holds an op whose converter is not known
    to be exact on symbols (``SYMBOLIC_OPS``), or when any step cannot be carried exactly
    (the caller then converts at each size)."""
    ops = {node.op_type for node in model.gp.node if node.domain in ("", "ai.onnx")}
    if any(node.domain not in ("", "ai.onnx") for node in model.gp.node) or not ops <= SYMBOLIC_OPS:
        log.debug("%s: converted per size (ops not carried symbolically: %s)", model.where,
                  ", ".join(sorted(ops - SYMBOLIC_OPS)) or "other domains")
        return None
    try:
        graph = model.convert({**dims, **{key: Sym(names[key]) for key in free}})
        _fits_a_representative_size(graph)  # (else: converted per size, which says why)
    except Exception as exc:  # any failure: the per-size conversion decides, and names it
        log.debug("%s: converted per size (%s: %s)", model.where, type(exc).__name__, exc)
        return None
    return graph


def _fits_a_representative_size(graph: Graph) -> None:
    """``GraphError`` unless the constraints the graph recorded hold at one of
    ``REPRESENTATIVE_SIZES`` (checked by binding its inputs' shapes there: the compile
    that places the graph specializes it, once)."""
    problems = []
    for size in REPRESENTATIVE_SIZES:
        at = dict.fromkeys(graph.symbols, size)
        try:
            graph.bind({graph.node(i).name: tuple(evaluate(d, at) for d in graph.node(i).shape) for i in graph.inputs})
            return
        except (InputError, UnboundSymbolError) as exc:
            problems.append(f"{size}: {exc}")
    raise GraphError(f"no representative size fits: {'; '.join(problems)}")


def _sizeless(message: str, size: int) -> str:
    """``message`` with the number ``size`` written as ``N``: failures at two sizes that
    read the same then are one fault of the model, whatever the sizes."""
    return re.sub(rf"(?<![\w.]){size}(?![\w.])", "N", message)


def without_weights(gp: GraphProto, params: set[str]) -> GraphProto:
    """A copy of ``gp`` whose initializers named in ``params`` keep name, dtype and dims
    but no data (never read again: the graph's arrays are handed to each conversion)."""
    kept = GraphProto()
    kept.name = gp.name
    for field in ("node", "input", "output", "value_info"):
        getattr(kept, field).extend(getattr(gp, field))
    for t in gp.initializer:
        if t.name in params:
            stub = kept.initializer.add()
            stub.name, stub.data_type = t.name, t.data_type
            stub.dims.extend(t.dims)
        else:
            kept.initializer.append(t)
    return kept
