"""Converters of shape and tensor ops: Reshape, Slice, Gather, Concat, Shape, Constant...

Most of these are where static folding happens: ``Shape``, ``Size``, ``Constant``,
``ConstantOfShape`` and ``Range`` always produce arrays known at import, and the others
fold whenever their operands are known (see ``_shapes``). In a symbolic load ``Shape`` and
``Size`` give dims where a size is symbolic (``_symdims``), and ``ConstantOfShape``,
``Range`` and ``Expand``'s ones of a symbolic shape are sized constants.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import AttributeProto

from ..ir.shape_rules import has_sym
from ..ir.symbolic import Dim, Sym, ceildiv, dim_eq, sym_max
from ._context import NodeContext, converter, onnx_dtype
from ._shapes import Emitter, Operand, frozen
from ._symdims import Dims, NotSymbolic, make_dims, nonnegative

__all__: list[str] = []


def _axis(c: NodeContext, axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise c.fail(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank


@converter("Identity")
def _identity(c: NodeContext) -> list[Operand | None]:
    return [c.input(0)]


@converter("Dropout")
def _dropout(c: NodeContext) -> list[Operand | None]:
    """Inference: the identity, with an all-true mask if the model reads the mask."""
    training = c.static(2, "training_mode")
    if training is not None and bool(training.reshape(-1)[0]):
        raise c.fail("training_mode is true; rlx runs inference only")
    x = c.input(0)
    mask = None
    if c.used(1):
        c.f.check_size(c.f.shape(x), "bool", "Dropout's mask")
        mask = frozen(np.ones(c.f.shape(x), dtype=bool))
    return [x, mask]


@converter("Reshape")
def _reshape(c: NodeContext) -> list[Operand | None]:
    """0 copies the input's dim (unless ``allowzero``), -1 is inferred."""
    x = c.input(0)
    shape = c.f.shape(x)
    target = list(c.ints(1, "shape") if c.num_inputs > 1 else c.attr_ints("shape", ()))
    if not c.attr("allowzero", 0):
        for i, d in enumerate(target):
            if d == 0:
                if i >= len(shape):
                    raise c.fail(f"shape {tuple(target)} copies dim {i} (0), but the input has shape {shape}")
                target[i] = shape[i]
    return [c.f.op("reshape", x, shape=tuple(target), name=c.out())]


@converter("Transpose")
def _transpose(c: NodeContext) -> list[Operand | None]:
    return [c.f.op("transpose", c.input(0), perm=c.attr_ints("perm"), name=c.out())]


@converter("Flatten")
def _flatten(c: NodeContext) -> list[Operand | None]:
    x = c.input(0)
    shape = c.f.shape(x)
    axis = int(c.attr("axis", 1))
    if not -len(shape) <= axis <= len(shape):
        raise c.fail(f"axis {axis} is out of range for rank {len(shape)}")
    if axis < 0:
        axis += len(shape)
    target = (math.prod(shape[:axis]), math.prod(shape[axis:]))
    return [c.f.op("reshape", x, shape=target, name=c.out())]


@converter("Squeeze")
def _squeeze(c: NodeContext) -> list[Operand | None]:
    x = c.input(0)
    shape = c.f.shape(x)
    axes = c.attr_ints("axes") if c.has_attr("axes") else c.ints(1, "axes")
    if axes:
        drop = {_axis(c, a, len(shape), "axes") for a in axes}
        bad = [a for a in sorted(drop) if shape[a] != 1]
        if bad:
            raise c.fail(f"cannot squeeze axis {bad[0]} of shape {shape}: its size is not 1")
    else:
        if has_sym(shape):  # which axes are 1 is known only with the sizes
            raise NotSymbolic(f"Squeeze without axes of shape {shape}")
        drop = {i for i, d in enumerate(shape) if d == 1}
    target = tuple(d for i, d in enumerate(shape) if i not in drop)
    return [c.f.op("reshape", x, shape=target, name=c.out())]


@converter("Unsqueeze")
def _unsqueeze(c: NodeContext) -> list[Operand | None]:
    x = c.input(0)
    shape = c.f.shape(x)
    axes = c.attr_ints("axes") if c.has_attr("axes") else c.ints(1, "axes")
    if not axes:
        raise c.fail("needs axes")
    rank = len(shape) + len(axes)
    new = sorted(_axis(c, a, rank, "axes") for a in axes)
    if len(set(new)) != len(new):
        raise c.fail(f"axes {axes} repeat an axis")
    dims = iter(shape)
    target = tuple(1 if i in new else next(dims) for i in range(rank))
    return [c.f.op("reshape", x, shape=target, name=c.out())]


@converter("Concat")
def _concat(c: NodeContext) -> list[Operand | None]:
    if not c.has_attr("axis"):
        raise c.fail("needs an axis attribute")
    return [c.f.op("concat", *c.inputs(), axis=int(c.attr("axis")), name=c.out())]


@converter("Split")
def _split(c: NodeContext) -> list[Operand | None]:
    """Sizes from the ``split`` attribute (older opsets) or input; else equal parts, the
    last one smaller when the dim does not divide (opset >= 18, ``num_outputs``)."""
    x = c.input(0)
    shape = c.f.shape(x)
    axis = _axis(c, int(c.attr("axis", 0)), len(shape))
    dim, n = shape[axis], c.num_outputs
    if isinstance(dim, Sym):
        raise NotSymbolic(f"Split of axis {axis}, whose size {dim} depends on the sizes")
    sizes = c.attr_ints("split") if c.has_attr("split") else c.ints(1, "split")
    if sizes:
        if len(sizes) != n or sum(sizes) != dim or min(sizes) < 0:
            raise c.fail(f"split sizes {sizes} do not cut axis {axis} of size {dim} into {n} outputs")
    else:
        if c.has_attr("num_outputs") and int(c.attr("num_outputs")) != n:
            raise c.fail(f"num_outputs is {c.attr('num_outputs')}, but the node has {n} outputs")
        chunk = -(-dim // n)
        if dim % n and (c.opset < 18 or chunk * (n - 1) > dim):
            raise c.fail(f"cannot split axis {axis} of size {dim} into {n} equal parts")
        sizes = (chunk,) * (n - 1) + (dim - chunk * (n - 1),)
    outs: list[Operand | None] = []
    start = 0
    for i, size in enumerate(sizes):
        if c.used(i):
            outs.append(c.f.op("slice", x, starts=(start,), ends=(start + size,), axes=(axis,), name=c.out(i)))
        else:
            outs.append(None)
        start += size
    return outs


@converter("Slice")
def _slice(c: NodeContext) -> list[Operand | None]:
    x = c.input(0)
    if c.num_inputs > 1:
        starts, ends = c.ints(1, "starts"), c.ints(2, "ends")
        axes, steps = c.ints(3, "axes"), c.ints(4, "steps")
    else:  # opset < 10
        starts, ends, axes, steps = c.attr_ints("starts"), c.attr_ints("ends"), c.attr_ints("axes"), None
    if starts is None or ends is None:
        raise c.fail("needs starts and ends")
    return [c.f.op("slice", x, starts=starts, ends=ends, axes=axes, steps=steps, name=c.out())]


@converter("Gather")
def _gather(c: NodeContext) -> list[Operand | None]:
    return [c.f.op("gather", c.input(0), c.input(1), axis=int(c.attr("axis", 0)), name=c.out())]


@converter("Expand")
def _expand(c: NodeContext) -> list[Operand | None]:
    """Broadcast to ``shape``: a multiply by ones of the smallest shape that broadcasts
    the input to the result (``where`` for bool), exact for every value."""
    f, x = c.f, c.input(0)
    shape = f.shape(x)
    want = tuple(c.ints(1, "shape") or ())
    if has_sym(shape) or has_sym(want):
        out = _sym_broadcast(c, shape, want)
    else:
        try:
            out = tuple(np.broadcast_shapes(shape, want))
        except ValueError:
            raise c.fail(f"cannot expand shape {shape} to {want}") from None
    if out == shape:
        return [x]
    lead = len(out) - len(shape)
    ones_shape = tuple(1 if i >= lead and dim_eq(shape[i - lead], d) else d for i, d in enumerate(out))
    dtype = f.dtype(x)
    ones = f.full(ones_shape, 1, dtype)
    if dtype == "bool":
        return [f.op("where", ones, x, x, name=c.out())]
    return [f.op("mul", x, ones, name=c.out())]


def _sym_broadcast(c: NodeContext, shape: tuple[Dim, ...], want: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """ONNX's two-way broadcast of ``shape`` and ``want`` where dims are symbolic. Two dims
    neither of which is 1 must be equal: where that depends on the sizes (``min(256,
    seq)`` against ``seq``) the result takes ``want``'s, and the ``mul`` that broadcasts
    records the constraint, checked by every run, as the IR's own broadcasting does."""
    rank = max(len(shape), len(want))
    a = (1,) * (rank - len(shape)) + tuple(shape)
    b = (1,) * (rank - len(want)) + tuple(want)
    out = []
    for p, q in zip(a, b):
        if isinstance(q, int) and q == 1:
            out.append(p)
        elif isinstance(p, int) and p == 1:
            out.append(q)
        elif dim_eq(p, q) is False:
            raise c.fail(f"cannot expand shape {shape} to {want}")
        else:  # equal, or equal at run time: the broadcast that follows records ``p == q``, as the IR's does
            out.append(q)
    return tuple(out)


@converter("Cast", "CastLike")
def _cast(c: NodeContext) -> list[Operand | None]:
    x = c.input(0)
    if c.op_type == "CastLike":
        dtype = c.dtype(1)
    else:
        if not c.has_attr("to"):
            raise c.fail("needs a 'to' attribute")
        dtype = onnx_dtype(int(c.attr("to")), "its target ('to')")
    if dtype == c.f.dtype(x):
        return [x]
    if dtype in FLOAT8_DTYPES and int(c.attr("saturate", 1)):
        x = saturated(c.f, x, dtype)
    return [c.f.op("cast", x, dtype=dtype, name=c.out())]


#: The float8 formats: ONNX's Cast and QuantizeLinear saturate to them by default.
FLOAT8_DTYPES = frozenset({"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"})


def saturated(f: Emitter, x: Operand, dtype: str) -> Operand:
    """``x`` clipped to the largest finite magnitude of float8 ``dtype`` (infinities too;
    NaN stays NaN), so that the cast that follows saturates as ONNX's ``saturate=1``
    says instead of giving NaN or an infinity. A source that is not a computing float is
    first cast to float32 (exact for every storage format and for the integers in range)."""
    import ml_dtypes

    src = f.dtype(x)
    if src not in ("float16", "float32", "float64"):
        x, src = f.op("cast", x, dtype="float32"), "float32"
    top = float(ml_dtypes.finfo(dtype).max)
    return f.op("minimum", f.op("maximum", x, f.const(-top, src)), f.const(top, src))


_CONSTANT_ATTRS = ("value", "value_float", "value_floats", "value_int", "value_ints", "sparse_value",
                   "value_string", "value_strings")


@converter("Constant")
def _constant(c: NodeContext) -> list[Operand | None]:
    given = [a for a in _CONSTANT_ATTRS if c.has_attr(a)]
    if len(given) != 1:
        raise c.fail(f"needs exactly one of {', '.join(_CONSTANT_ATTRS)}; got {given or 'none'}")
    kind = given[0]
    if kind in ("value_string", "value_strings"):
        raise c.fail("string constants are not supported (rlx has no string dtype)")
    if kind == "value":
        return [c.attr("value")]
    if kind == "sparse_value":
        return [_dense(c, c.attr("sparse_value"))]
    dtype = np.float32 if kind.startswith("value_float") else np.int64
    return [frozen(np.asarray(c.attr(kind), dtype=dtype))]


def _dense(c: NodeContext, attribute: AttributeProto) -> np.ndarray:
    sparse = attribute.sparse_tensor
    values = c.tensor(sparse.values, "attribute 'sparse_value' values")
    indices = c.tensor(sparse.indices, "attribute 'sparse_value' indices")
    dims = tuple(int(d) for d in sparse.dims)
    c.f.check_size(dims, values.dtype.name, "the dense form of sparse_value")
    dense = np.zeros(dims, dtype=values.dtype)
    if indices.ndim == 1:
        dense.reshape(-1)[indices] = values
    else:
        dense[tuple(indices.T)] = values
    return frozen(dense)


@converter("ConstantOfShape")
def _constant_of_shape(c: NodeContext) -> list[Operand | None]:
    shape = c.ints(0, "shape")
    value = c.attr("value")
    value = np.zeros(1, dtype=np.float32) if value is None else value
    if value.size != 1:
        raise c.fail(f"value must hold one element, got shape {value.shape}")
    if has_sym(shape or ()):  # sizes known at run time: filled once they are (a sized constant)
        if not all(nonnegative(d) for d in shape):
            raise NotSymbolic(f"shape {shape} may have a negative dim")
        return [c.f.graph.sized_constant("fill", shape, value.dtype.name, name=c.out(), value=value.reshape(())[()])]
    if any(d < 0 for d in shape or ()):
        raise c.fail(f"shape {shape} has a negative dim")
    c.f.check_size(shape or (), value.dtype.name, "ConstantOfShape's result")
    return [frozen(np.full(shape or (), value.reshape(()), dtype=value.dtype))]


@converter("Shape")
def _shape(c: NodeContext) -> list[Operand | None]:
    shape = c.shape(0)
    start, end = int(c.attr("start", 0)), c.attr("end")
    return [make_dims(list(shape[start : None if end is None else int(end)]), "int64")]


@converter("Size")
def _size(c: NodeContext) -> list[Operand | None]:
    return [make_dims(math.prod(c.shape(0)), "int64")]


@converter("Range")
def _range(c: NodeContext) -> list[Operand | None]:
    """``start + i * delta`` for i < max(ceil((limit - start) / delta), 0)."""
    if any(isinstance(c.optional(i), Dims) for i in range(3)):
        return [_sized_range(c)]
    start, limit, delta = (c.static(i, what) for i, what in enumerate(("start", "limit", "delta")))
    if start is None or limit is None or delta is None:
        raise c.fail("needs start, limit and delta")
    dtype = start.dtype
    if dtype == np.float16 and int(c.attr("stash_type", 1)) == 0:
        raise c.fail("stash_type 0 (float16 accumulation) is not supported; rlx computes Range in float64")
    s, lim, d = (v.reshape(-1)[0].item() for v in (start, limit, delta))
    if d == 0:
        raise c.fail("delta is 0")
    n = max(-((s - lim) // d) if dtype.kind in "iu" else math.ceil((lim - s) / d), 0)
    c.f.check_size((n,), dtype.name, "Range's result")
    return [frozen((s + np.arange(n, dtype=np.float64 if dtype.kind == "f" else dtype) * d).astype(dtype))]


def _sized_range(c: NodeContext) -> Operand:
    """``Range`` with a bound that depends on the sizes (``arange(seq)``, ``arange(past,
    past + seq)``): a sized constant of ``max(ceil((limit - start) / delta), 0)``
    elements; the delta must be a nonzero constant."""
    start, limit = (c.ints(i, what) for i, what in ((0, "start"), (1, "limit")))
    delta = c.ints(2, "delta")
    if start is None or limit is None or delta is None or len(start) != 1 or len(limit) != 1 or len(delta) != 1:
        raise c.fail("needs scalar start, limit and delta")
    (s,), (lim,), (d,) = start, limit, delta
    if isinstance(d, Sym) or d == 0:
        raise NotSymbolic(f"Range's delta {d} is not a nonzero constant")
    n = sym_max(ceildiv(lim - s, d) if d > 0 else ceildiv(s - lim, -d), 0)
    return c.f.graph.sized_constant("arange", (n,), c.dtype(0), name=c.out(), start=s, delta=d)


