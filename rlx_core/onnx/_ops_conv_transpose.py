"""The ``ConvTranspose`` converter (1-D, 2-D and 3-D): a stride-1 convolution over the input
spread out by the stride, as the transposed convolution is defined.

``ConvTranspose(x, W)`` with stride ``s``, dilation ``d``, pads ``(pb, pe)`` and output
padding ``op`` equals a stride-1 convolution with dilation ``d`` of ``x`` with ``s - 1``
zeros between its pixels and ``d * (k - 1) - pb`` zeros before / ``d * (k - 1) - pe +
op`` after (a negative count crops), by the weights with their two channel axes swapped
within each group and both spatial axes reversed. rlx shapes are static, so the spread
and the padding of each spatial axis is one ``gather`` (from the input with one zero
row appended) by a constant index table, and the weights' rearrangement is a
``reshape``/``transpose``/``gather`` of the weight, which the backends compute once when
it is a param (set_param included). A 3-D one (3-D U-Nets, video decoders) spreads all three
axes the same way and runs the 3-D convolution that ``Conv`` does (``_ops_nn.conv3d``:
one ``conv2d`` per kernel depth, summed).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._context import NodeContext, converter
from ._ops_nn import _as_2d, _back_to_1d, _one_d, _pair_attr, _spatial, conv3d
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
    if len(f.shape(x)) == 5:
        return [_conv_transpose_3d(c, x, w, b)]
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
    full = _full_output(c, (h, wd), (kh, kw), strides, dilations, extra)
    xs = _spread_input(c, x, (kh, kw), strides, dilations, full, _transpose_pads(c, one_d, full, (h, wd), strides))
    wt = _flipped_weights(f, w, group)
    operands = (xs, wt) if b is None else (xs, wt, b)
    y = f.op("conv2d", *operands, stride=(1, 1), padding=(0, 0, 0, 0), dilation=dilations, groups=group,
             name="" if one_d else c.out())
    return [_back_to_1d(c, y, one_d)]


def _conv_transpose_3d(c: NodeContext, x: Operand, w: Operand, b: Operand | None) -> Operand:
    """A 3-D ConvTranspose: the input spread along depth, height and width, then the
    stride-1 3-D convolution by the flipped weights."""
    f = c.f
    size, ws = f.shape(x)[2:], f.shape(w)
    if len(ws) != 5:
        raise c.fail(f"W must be (C_in, C_out / group, kd, kh, kw) for a 3-D ConvTranspose, got shape {ws}")
    kernel = tuple(ws[2:])
    group = int(c.attr("group", 1))
    if group < 1 or ws[0] % group or f.shape(x)[1] != ws[0]:
        raise c.fail(f"input channels {f.shape(x)[1]} and W's {ws[0]} do not fit group {group}")
    declared = c.attr_ints("kernel_shape")
    if declared is not None and tuple(declared) != kernel:
        raise c.fail(f"kernel_shape {declared} does not match the weight's shape {ws}")
    strides, dilations, extra = (c.attr_ints(name, (default,) * 3) for name, default in
                                 (("strides", 1), ("dilations", 1), ("output_padding", 0)))
    assert strides is not None and dilations is not None and extra is not None
    if not len(strides) == len(dilations) == len(extra) == 3:
        raise c.fail(f"strides, dilations and output_padding must have 3 entries for a 3-D ConvTranspose, got "
                     f"{strides}, {dilations} and {extra}")
    full = _full_output(c, size, kernel, strides, dilations, extra)
    xs = _spread_input(c, x, kernel, strides, dilations, full, _transpose_pads_nd(c, full, size, strides))
    return conv3d(c, xs, _flipped_weights(f, w, group), b, (1, 1, 1), tuple(dilations), (0,) * 6, group, c.out())


def _full_output(c: NodeContext, size: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                 dilations: Sequence[int], extra: Sequence[int]) -> list[int]:
    """The transposed convolution's whole output along each spatial axis, before pads are
    taken off (``output_padding`` ``extra`` checked against the stride and dilation)."""
    if any(e >= max(s, d) for e, s, d in zip(extra, strides, dilations)):
        raise c.fail(f"output_padding {tuple(extra)} must be smaller than the stride or the dilation")
    return [s * (n - 1) + e + (k - 1) * d + 1 for n, s, e, k, d in zip(size, strides, extra, kernel, dilations)]


def _spread_input(c: NodeContext, x: Operand, kernel: Sequence[int], strides: Sequence[int],
                  dilations: Sequence[int], full: list[int], pads: tuple[int, ...]) -> Operand:
    """``x`` spread by the strides and padded on each spatial axis, so that a stride-1
    convolution reads every window of the output ``full`` less ``pads`` (begins, then ends)."""
    nd = len(full)
    out = [fl - pads[i] - pads[i + nd] for i, fl in enumerate(full)]
    if any(n <= 0 for n in out):
        raise c.fail(f"the pads {pads} leave no output (full output {tuple(full)})")
    for axis, (s, k, d, n_out) in enumerate(zip(strides, kernel, dilations, out), start=2):
        x = _spread(c.f, x, axis, s, d * (k - 1) - pads[axis - 2], n_out + d * (k - 1))
    return x


def _transpose_pads(c: NodeContext, one_d: bool, full: list[int], size: tuple[int, int],
                    strides: tuple[int, int]) -> tuple[int, ...]:
    """(top, left, bottom, right) of a 1-D (run as 2-D) or 2-D ConvTranspose: see
    ``_transpose_pads_nd``."""
    if one_d:
        begin, end = _transpose_pads_nd(c, full[1:], size[1:], strides[1:])
        return (0, begin, 0, end)
    return _transpose_pads_nd(c, full, size, strides)


def _transpose_pads_nd(c: NodeContext, full: list[int], size: tuple[int, ...],
                       strides: tuple[int, ...]) -> tuple[int, ...]:
    """The begins, then the ends, taken off the full output on each spatial axis: from
    ``output_shape`` or a SAME ``auto_pad`` (the spec's split of the difference; negative:
    the output extends past the full one at the end, where only the bias lands, as ONNX's
    reference computes it), else the ``pads`` attribute (none for VALID)."""
    nd = len(full)
    wanted = c.attr_ints("output_shape")
    auto = c.attr("auto_pad", "NOTSET") or "NOTSET"
    if wanted is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        if wanted is None:
            wanted = tuple(n * s for n, s in zip(size, strides))
        if len(wanted) != nd:
            raise c.fail(f"output_shape must have {nd} entries, got {wanted}")
        totals = [fl - o for fl, o in zip(full, wanted)]
        upper = auto == "SAME_UPPER"
        begins = [t // 2 if upper else t - t // 2 for t in totals]
        return (*begins, *(t - b for t, b in zip(totals, begins)))
    if auto not in ("NOTSET", "VALID"):
        raise c.fail(f"unknown auto_pad {auto!r}")
    if auto == "VALID":
        return (0,) * (2 * nd)
    got = c.attr_ints("pads", (0,) * (2 * nd))
    assert got is not None
    if len(got) != 2 * nd:
        raise c.fail(f"pads must have {2 * nd} entries for a {nd}-D ConvTranspose, got {got}")
    return tuple(got)


def _flipped_weights(f: Emitter, w: Operand, group: int) -> Operand:
    """(C_in, C_out/g, *k) -> (C_out, C_in/g, *k), every spatial axis reversed: the
    convolution's weights that give the transposed one."""
    cin, cout_g, *kernel = f.shape(w)
    cin_g = cin // group
    wt = f.op("reshape", w, shape=(group, cin_g, cout_g, *kernel))
    wt = f.op("transpose", wt, perm=(0, 2, 1, *range(3, 3 + len(kernel))))
    wt = f.op("reshape", wt, shape=(group * cout_g, cin_g, *kernel))
    for axis, k in enumerate(kernel, start=2):
        if k > 1:
            wt = f.op("gather", wt, frozen(np.arange(k - 1, -1, -1, dtype=np.int64)), axis=axis)
    return wt
