"""Converters of the recurrent layers: LSTM, GRU, RNN, unrolled over the sequence.

Why unrolled: the IR has no loop. Each load (and each set of sizes a graph loaded
without ``dims`` is converted again for, ``_dynamic.py``) knows the sequence length, so
the recurrence becomes that many steps of plain ops: the input projection of every step
at once (one ``matmul`` over ``(seq * batch, input)``), then per step one ``matmul`` by
the recurrent weights, the gates as ``slice``s of it and their activations. The weights
stay params (replaceable with ``set_param``).

Read as the spec writes them: gate orders ``iofc`` (LSTM) and ``zrh`` (GRU), ``B`` the
input and recurrent biases concatenated, ``direction`` forward, reverse or bidirectional,
``layout`` 0 (sequence first) or 1 (batch first), ``initial_h``/``initial_c``, LSTM
peepholes ``P`` and ``input_forget``, GRU ``linear_before_reset``, ``clip``, and the
activations Sigmoid, Tanh and Relu. ``sequence_lens`` is read when it is known at import
and every length is the full sequence (what exporters write for unpadded batches);
other lengths are refused by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ._context import NodeContext, converter
from ._shapes import Emitter, Operand, frozen

__all__: list[str] = []

_ACTIVATIONS: dict[str, str] = {"Sigmoid": "sigmoid", "Tanh": "tanh", "Relu": "relu"}
_DEFAULTS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


class _Layer:
    """What every step of one direction reads: the node's settings and operands."""

    def __init__(self, c: NodeContext) -> None:
        self.c, self.f = c, c.f
        f = c.f
        op = c.op_type
        self.gates = _GATES[op]
        x, w, r = c.input(0, "X"), c.input(1, "W"), c.input(2, "R")
        self.dtype = f.dtype(x)
        if self.dtype not in ("float16", "float32", "float64"):
            raise c.fail(f"needs a float X, got {self.dtype}")
        self.layout = int(c.attr("layout", 0))
        if self.layout not in (0, 1):
            raise c.fail(f"layout {self.layout} is not 0 or 1")
        xs = f.shape(x)
        if len(xs) != 3:
            raise c.fail(f"X must be 3-D, got shape {xs}")
        self.x = x if self.layout == 0 else f.op("transpose", x, perm=(1, 0, 2))  # (seq, batch, input)
        self.seq, self.batch, self.input = (xs[0], xs[1], xs[2]) if self.layout == 0 else (xs[1], xs[0], xs[2])
        direction = str(c.attr("direction", "forward"))
        if direction not in ("forward", "reverse", "bidirectional"):
            raise c.fail(f"direction {direction!r} is not forward, reverse or bidirectional")
        self.directions = ("forward", "reverse") if direction == "bidirectional" else (direction,)
        n_dir = len(self.directions)
        ws, rs = f.shape(w), f.shape(r)
        self.hidden = int(c.attr("hidden_size", 0)) or rs[-1]
        h, g = self.hidden, self.gates
        if ws != (n_dir, g * h, self.input) or rs != (n_dir, g * h, h):
            raise c.fail(f"W {ws} and R {rs} do not fit {n_dir} direction(s), {g} gates of hidden_size {h} over "
                         f"input size {self.input}")
        self.w, self.r = w, r
        self.b = c.optional(3)
        if self.b is not None and f.shape(self.b) != (n_dir, 2 * g * h):
            raise c.fail(f"B has shape {f.shape(self.b)}, expected {(n_dir, 2 * g * h)}")
        self._check_lengths()
        self.init_h = c.optional(5)
        names = c.attr("activations") or [a for _ in self.directions for a in _DEFAULTS[op]]
        per = len(_DEFAULTS[op])
        if len(names) != per * n_dir:
            raise c.fail(f"needs {per * n_dir} activations, got {list(names)}")
        unknown = [a for a in names if a not in _ACTIVATIONS]
        if unknown:
            raise c.fail(f"activation {unknown[0]!r} is not supported (rlx reads {', '.join(_ACTIVATIONS)})")
        self.acts = [tuple(_ACTIVATIONS[a] for a in names[d * per : (d + 1) * per]) for d in range(n_dir)]
        if c.has_attr("activation_alpha") or c.has_attr("activation_beta"):
            raise c.fail("activation_alpha/activation_beta are not supported (no activation here takes them)")
        self.clip = c.attr("clip")

    def _check_lengths(self) -> None:
        lens = self.c.optional(4)
        if lens is None:
            return
        arr = self.f.array(lens)
        if arr is None or not np.all(arr.reshape(-1) == self.seq) or arr.size != self.batch:
            raise self.c.fail("sequence_lens other than the full sequence length for every batch entry is not "
                              "supported (rlx unrolls the whole sequence)")

    # ------------------------------------------------------------ pieces
    def of_direction(self, v: Operand, d: int) -> Operand:
        """Direction ``d``'s slice of a (dirs, ...) operand, without its leading axis."""
        f = self.f
        shape = f.shape(v)
        return f.op("reshape", f.op("slice", v, starts=[d], ends=[d + 1], axes=[0]), shape=shape[1:])

    def act(self, name: str, v: Operand) -> Operand:
        return self.f.op(name, v)

    def clipped(self, v: Operand) -> Operand:
        if self.clip is None:
            return v
        bound = float(self.clip)
        f = self.f
        return f.op("minimum", f.op("maximum", v, f.const(-bound, self.dtype)), f.const(bound, self.dtype))

    def gate(self, v: Operand, k: int, width: int | None = None) -> Operand:
        """Gate ``k`` (hidden columns) of a (batch, gates * hidden) operand."""
        h = self.hidden
        return self.f.op("slice", v, starts=[k * h], ends=[(k + (width or 1)) * h], axes=[1])

    def input_projection(self, d: int) -> tuple[Operand, Operand | None, Operand]:
        """Every step's ``X W^T (+ the biases that add straight in)`` as (seq, batch, G*H),
        the recurrent bias left apart (GRU's ``linear_before_reset`` needs its h part
        inside), and ``R^T`` (H, G*H)."""
        f, g, h = self.f, self.gates, self.hidden
        wt = f.op("transpose", self.of_direction(self.w, d), perm=(1, 0))
        rt = f.op("transpose", self.of_direction(self.r, d), perm=(1, 0))
        flat = f.op("reshape", self.x, shape=(self.seq * self.batch, self.input))
        xw = f.op("matmul", flat, wt)
        rb = None
        if self.b is not None:
            b = self.of_direction(self.b, d)
            wb = f.op("slice", b, starts=[0], ends=[g * h], axes=[0])
            rb = f.op("slice", b, starts=[g * h], ends=[2 * g * h], axes=[0])
            xw = f.op("add", xw, wb)
        return f.op("reshape", xw, shape=(self.seq, self.batch, g * h)), rb, rt

    def initial(self, v: Operand | None, d: int) -> Operand:
        """Direction ``d``'s initial state (batch, hidden): zeros when not given; layout 1
        gives it (batch, dirs, hidden)."""
        if v is None:
            return frozen(np.zeros((self.batch, self.hidden), dtype=self.dtype))
        if self.layout == 1:
            v = self.f.op("transpose", v, perm=(1, 0, 2))
        return self.of_direction(v, d)

    def step_input(self, xw: Operand, t: int) -> Operand:
        f = self.f
        one = f.op("slice", xw, starts=[t], ends=[t + 1], axes=[0])
        return f.op("reshape", one, shape=(self.batch, self.gates * self.hidden))

    def outputs(self, hs: Sequence[Sequence[Operand]], finals: Sequence[Sequence[Operand]]) -> list[Operand | None]:
        """Y (seq, dirs, batch, hidden) or batch-first, then each final state (dirs, batch, hidden)."""
        f, c = self.f, self.c
        n_dir = len(self.directions)
        per_step = [f.op("concat", *[f.op("reshape", hs[d][t], shape=(1, 1, self.batch, self.hidden))
                                     for d in range(n_dir)], axis=1) for t in range(self.seq)]
        y = f.op("concat", *per_step, axis=0) if self.seq > 1 else per_step[0]
        if self.layout == 1:
            y = f.op("transpose", y, perm=(2, 0, 1, 3))
        outs: list[Operand | None] = [f.op("reshape", y, shape=f.shape(y), name=c.out(0)) if c.used(0) else None]
        for k in range(len(finals[0])):
            if not c.used(k + 1):
                outs.append(None)
                continue
            stacked = f.op("concat", *[f.op("reshape", finals[d][k], shape=(1, self.batch, self.hidden))
                                       for d in range(n_dir)], axis=0)
            if self.layout == 1:
                stacked = f.op("transpose", stacked, perm=(1, 0, 2))
            outs.append(f.op("reshape", stacked, shape=f.shape(stacked), name=c.out(k + 1)))
        return outs


def _run(layer: _Layer, step: Callable[[_Layer, int, int, list[Operand]], list[Operand]],
         states: Callable[[_Layer, int], list[Operand]]) -> list[Operand | None]:
    """Each direction's recurrence over the sequence; ``step(layer, d, x_t, state) ->
    state`` (the hidden state first), ``states(layer, d)`` the initial state."""
    hs: list[list[Operand]] = []
    finals: list[list[Operand]] = []
    for d, direction in enumerate(layer.directions):
        state = states(layer, d)
        order = range(layer.seq) if direction == "forward" else range(layer.seq - 1, -1, -1)
        out: dict[int, Operand] = {}
        for t in order:
            state = step(layer, d, t, state)
            out[t] = state[0]
        hs.append([out[t] for t in range(layer.seq)])
        finals.append(state)
    return layer.outputs(hs, finals)


def _with_rb(f: Emitter, v: Operand, rb: Operand | None) -> Operand:
    return v if rb is None else f.op("add", v, rb)


@converter("LSTM")
def _lstm(c: NodeContext) -> list[Operand | None]:
    layer = _Layer(c)
    f, h = layer.f, layer.hidden
    peep = c.optional(7)
    coupled = bool(c.attr("input_forget", 0))
    init_c = c.optional(6)
    parts = [layer.input_projection(d) for d in range(len(layer.directions))]

    def states(lay: _Layer, d: int) -> list[Operand]:
        return [lay.initial(lay.init_h, d), lay.initial(init_c, d)]

    def step(lay: _Layer, d: int, t: int, state: list[Operand]) -> list[Operand]:
        xw, rb, rt = parts[d]
        h_prev, c_prev = state
        z = _with_rb(f, f.op("add", lay.step_input(xw, t), f.op("matmul", h_prev, rt)), rb)
        fi, fo, ff, fc = (lay.gate(z, k) for k in range(4))  # iofc
        if peep is not None:
            p = lay.of_direction(peep, d)
            pi, po, pf = (f.op("slice", p, starts=[k * h], ends=[(k + 1) * h], axes=[0]) for k in range(3))
            fi, ff = f.op("add", fi, f.op("mul", pi, c_prev)), f.op("add", ff, f.op("mul", pf, c_prev))
        g_act, c_act, h_act = lay.acts[d]
        i = lay.act(g_act, lay.clipped(fi))
        fg = f.op("sub", f.const(1.0, lay.dtype), i) if coupled else lay.act(g_act, lay.clipped(ff))
        cell = f.op("add", f.op("mul", fg, c_prev), f.op("mul", i, lay.act(c_act, lay.clipped(fc))))
        if peep is not None:
            fo = f.op("add", fo, f.op("mul", po, cell))
        o = lay.act(g_act, lay.clipped(fo))
        return [f.op("mul", o, lay.act(h_act, cell)), cell]

    return _run(layer, step, states)


@converter("GRU")
def _gru(c: NodeContext) -> list[Operand | None]:
    layer = _Layer(c)
    f, h = layer.f, layer.hidden
    before_reset = bool(c.attr("linear_before_reset", 0))
    parts = [layer.input_projection(d) for d in range(len(layer.directions))]

    def states(lay: _Layer, d: int) -> list[Operand]:
        return [lay.initial(lay.init_h, d)]

    def step(lay: _Layer, d: int, t: int, state: list[Operand]) -> list[Operand]:
        xw, rb, rt = parts[d]
        (h_prev,) = state
        x_t = lay.step_input(xw, t)
        rt_zr = f.op("slice", rt, starts=[0], ends=[2 * h], axes=[1])
        rt_h = f.op("slice", rt, starts=[2 * h], ends=[3 * h], axes=[1])
        rb_zr = None if rb is None else f.op("slice", rb, starts=[0], ends=[2 * h], axes=[0])
        rb_h = None if rb is None else f.op("slice", rb, starts=[2 * h], ends=[3 * h], axes=[0])
        zr = _with_rb(f, f.op("add", lay.gate(x_t, 0, 2), f.op("matmul", h_prev, rt_zr)), rb_zr)
        g_act, h_act = lay.acts[d]
        z = lay.act(g_act, lay.clipped(lay.gate(zr, 0)))
        r = lay.act(g_act, lay.clipped(lay.gate(zr, 1)))
        if before_reset:
            rec = f.op("mul", r, _with_rb(f, f.op("matmul", h_prev, rt_h), rb_h))
        else:
            rec = _with_rb(f, f.op("matmul", f.op("mul", r, h_prev), rt_h), rb_h)
        cand = lay.act(h_act, lay.clipped(f.op("add", lay.gate(x_t, 2), rec)))
        keep = f.op("mul", z, h_prev)
        new = f.op("mul", f.op("sub", f.const(1.0, lay.dtype), z), cand)
        return [f.op("add", new, keep)]

    return _run(layer, step, states)


@converter("RNN")
def _rnn(c: NodeContext) -> list[Operand | None]:
    layer = _Layer(c)
    f = layer.f
    parts = [layer.input_projection(d) for d in range(len(layer.directions))]

    def states(lay: _Layer, d: int) -> list[Operand]:
        return [lay.initial(lay.init_h, d)]

    def step(lay: _Layer, d: int, t: int, state: list[Operand]) -> list[Operand]:
        xw, rb, rt = parts[d]
        z = _with_rb(f, f.op("add", lay.step_input(xw, t), f.op("matmul", state[0], rt)), rb)
        return [lay.act(lay.acts[d][0], lay.clipped(z))]

    return _run(layer, step, states)
