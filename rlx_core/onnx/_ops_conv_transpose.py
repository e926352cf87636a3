"""The ``ConvTranspose`` converter (1-D and 2-D): a ``conv2d`` over the input spread out by the
stride, as the transposed convolution is defined.

``ConvTranspose(x, W)`` with stride ``s``, dilation ``d``, pads ``(pb, pe)`` and output
padding ``op`` equals a stride-1 convolution with dilation ``d`` of ``x`` with ``s - 1``
zeros between its pixels and ``d * (k - 1) - pb`` zeros before / ``d * (k - 1) - pe +
op`` after (a negative count crops), by the weights with their two channel axes swapped
within each group and both spatial axes reversed. rlx shapes are static, so the spread
and the padding of each spatial axis is one ``gather`` (from the input with one zero
row appended) by a constant index table, and the weights' rearrangement is a
``reshape``/``transpose``/``gather`` of the weight, which the backends compute once when
it is a param (set_param included).
"""

from __future__ import annotations

import numpy as np

from ._context import NodeContext, converter
from ._ops_nn import _as_2d, _back_to_1d, _one_d, _pair_attr, _spatial
from ._shapes import Emitter, Operand, frozen

__all__: list[str] = []


def _spread(f: Emitter, x: Operand, axis: int, stride: int, before: int, length: int) -> Operand:
    """``x`` along ``axis`` with ``stride - 1`` zeros between its entries, ``before`` zeros
    first (a negative count drops entries) and zeros up to ``length`` entries."""
    shape = f.shape(x)
    n = shape[axis]
    pos = np.arange(length) - before
    hit = (pos >= 0) & (pos % stride == 0) & (pos // stride < n)
    index = np.where(hit, pos // stride, n).astype(np.int64)  # n: the zero row appended below
    if np.array_equal(index, np.arange(n)) and length == n:
        return x
    zero_shape = tuple(1 if i == axis else d for i, d in enumerate(shape))
    padded = f.op("concat", x, frozen(np.zeros(zero_shape, dtype=f.dtype(x))), axis=axis)
    return f.op("gather", padded, frozen(index), axis=axis)


@converter("ConvTranspose")
def _conv_transpose(c: NodeContext) -> list[Operand | None]:
    f, x, w, b = c.f, c.input(0, "X"), c.input(1, "W"), c.optional(2)
    h, wd = _spatial(c, x)
    one_d = _one_d(c)  # (N, C, L): run as (N, C, 1, L)
    if len(f.shape(w)) != (3 if one_d else 4):
        raise c.fail(f"W must be (C_in, C_out / group, {'k' if one_d else 'kh, kw'}), got shape {f.shape(w)}")
    x, w = _as_2d(c, x), _as_2d(c, w)
    wshape = f.shape(w)
    cin, _, kh, kw = wshape
    group = int(c.attr("group", 1))
    if group < 1 or cin % group or f.shape(x)[1] != cin:
        raise c.fail(f"input channels {f.shape(x)[1]} and W's {cin} do not fit group {group}")
    declared = c.attr_ints("kernel_shape")
    if declared is not None and tuple(declared) != ((kw,) if one_d else (kh, kw)):
        raise c.fail(f"kernel_shape {declared} does not match the weight's shape {wshape}")
    strides, dilations = _pair_attr(c, "strides", 1), _pair_attr(c, "dilations", 1)
    extra = _pair_attr(c, "output_padding", 0)
    if any(e >= max(s, d) for e, s, d in zip(extra, strides, dilations)):
        raise c.fail(f"output_padding {extra} must be smaller than the stride or the dilation")
    full = [s * (n - 1) + e + (k - 1) * d + 1 for n, s, e, k, d in zip((h, wd), strides, extra, (kh, kw), dilations)]
    pads = _transpose_pads(c, one_d, full, (h, wd), strides)
    out_hw = [fl - pads[i] - pads[i + 2] for i, fl in enumerate(full)]
    if any(n <= 0 for n in out_hw):
        raise c.fail(f"the pads {pads} leave no output (full output {tuple(full)})")
    # The input, spread and padded so that a stride-1 convolution reads every window.
    xs = x
    for axis, (s, k, d, n_out) in enumerate(zip(strides, (kh, kw), dilations, out_hw), start=2):
        before = d * (k - 1) - pads[axis - 2]
        xs = _spread(f, xs, axis, s, before, n_out + d * (k - 1))
    wt = _flipped_weights(f, w, group)
    operands = (xs, wt) if b is None else (xs, wt, b)
    y = f.op("conv2d", *operands, stride=(1, 1), padding=(0, 0, 0, 0), dilation=dilations, groups=group,
             name="" if one_d else c.out())
    return [_back_to_1d(c, y, one_d)]


def _transpose_pads(c: NodeContext, one_d: bool, full: list[int], size: tuple[int, int],
                    strides: tuple[int, int]) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) taken off the full output: from ``output_shape`` or a
    SAME ``auto_pad`` (the spec's split of the difference; negative: the output extends
    past the full one at the end, where only the bias lands, as ONNX's reference computes
    it), else the ``pads`` attribute (none for VALID)."""
    wanted = c.attr_ints("output_shape")
    auto = c.attr("auto_pad", "NOTSET") or "NOTSET"
    if wanted is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        if wanted is None:
            wanted = (size[0] * strides[0], size[1] * strides[1])
        elif one_d and len(wanted) == 1:
            wanted = (1, wanted[0])
        if len(wanted) != 2:
            raise c.fail(f"output_shape must have {1 if one_d else 2} entries, got {wanted}")
        totals = [fl - o for fl, o in zip(full, wanted[-2:])]
        upper = auto == "SAME_UPPER"
        begins = [t // 2 if upper else t - t // 2 for t in totals]
        return (begins[0], begins[1], totals[0] - begins[0], totals[1] - begins[1])
    if auto not in ("NOTSET", "VALID"):
        raise c.fail(f"unknown auto_pad {auto!r}")
    got = c.attr_ints("pads", (0, 0) if one_d else (0, 0, 0, 0)) if auto == "NOTSET" else None
    if got is None:
        return (0, 0, 0, 0)
    if len(got) != (2 if one_d else 4):
        raise c.fail(f"pads must have {2 if one_d else 4} entries for a {1 if one_d else 2}-D ConvTranspose, "
                     f"got {got}")
    return (0, got[0], 0, got[1]) if one_d else (got[0], got[1], got[2], got[3])


def _flipped_weights(f: Emitter, w: Operand, group: int) -> Operand:
    """(C_in, C_out/g, kh, kw) -> (C_out, C_in/g, kh, kw), both spatial axes reversed: the
    convolution's weights that give the transposed one."""
    cin, cout_g, kh, kw = f.shape(w)
    cin_g = cin // group
    wt = f.op("reshape", w, shape=(group, cin_g, cout_g, kh, kw))
    wt = f.op("transpose", wt, perm=(0, 2, 1, 3, 4))
    wt = f.op("reshape", wt, shape=(group * cout_g, cin_g, kh, kw))
    if kh > 1:
        wt = f.op("gather", wt, frozen(np.arange(kh - 1, -1, -1, dtype=np.int64)), axis=2)
    if kw > 1:
        wt = f.op("gather", wt, frozen(np.arange(kw - 1, -1, -1, dtype=np.int64)), axis=3)
    return wt
