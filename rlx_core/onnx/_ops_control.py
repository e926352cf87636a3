"""Converters of ONNX control flow: If, Loop and Scan, made into plain ops at import.

rlx's IR has no control flow, so every backend runs these models without knowing them:

- **If** converts the branch its condition picks. The condition must be known at import,
  as exporters' shape checks are; one computed from small inputs makes the model a
  ``ValueDependentGraph`` (built per value, ``_by_value``), and one computed from data
  cuts the model there (``_staged``). A branch holding ops that run on the host
  (``NonMaxSuppression``) is spliced into the graph instead (``SpliceIf``, ``_inline``).
- **Loop** is unrolled when its trip count and, after every iteration, its condition are
  known at import (a ``for`` loop as torch exports it): loop-carried values flow from one
  copy of the body to the next; scan outputs are stacked on a new first axis. A loop whose
  exit depends on the data, or longer than ``MAX_UNROLL``, raises ``NeedsHost``: the
  loader then runs it from the host, its body compiled once and run per iteration
  (``_staged``, ``ir.staged.LoopStep``).
- **Scan** is unrolled over the scanned axis (forward or reverse per input and output,
  any axes), its states carried through the copies; one longer than ``MAX_UNROLL`` or
  whose body holds host ops runs from the host, step by step (``ir.staged.ScanStep``).
  Scan 8 (opset 8: a batch axis, ``sequence_lens``) is unrolled per batch item, sequences
  of the full length only, and never runs from the host.

Unrolling makes a graph whose size grows with the trip count: at most ``MAX_UNROLL``
iterations are unrolled, more is refused by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._context import NeedsHost, NodeContext, SpliceIf, converter
from ._host_ops import held_in
from ._shapes import Emitter, Operand, frozen

__all__ = ["MAX_UNROLL", "scan_layout"]

#: The most iterations a Loop or Scan is unrolled into.
MAX_UNROLL = 1024


@converter("If")
def _if(c: NodeContext) -> list[Operand | None]:
    cond = c.static(0, "cond")
    if cond is None or cond.size != 1:
        raise c.fail(f"cond must hold one value, got {None if cond is None else cond.shape}")
    taken = bool(cond.reshape(-1)[0])
    branch = "then_branch" if taken else "else_branch"
    held = held_in(next((a.g for a in c.node.attribute if a.name == branch), None))
    if held:  # spliced into the graph by the loader, so that those ops run on the host between parts
        raise SpliceIf(f"its {branch} holds {', '.join(held)}, which run on the host", c.out(0), taken)
    return list(c.subgraph(branch))


def _stack(f: Emitter, items: Sequence[Operand], axis: int) -> Operand:
    """``items`` (one per iteration, same shape) stacked along a new ``axis``."""
    parts = []
    for x in items:
        shape = list(f.shape(x))
        shape.insert(axis, 1)
        parts.append(f.op("reshape", x, shape=tuple(shape)))
    return parts[0] if len(parts) == 1 else f.op("concat", *parts, axis=axis)


@converter("Loop")
def _loop(c: NodeContext) -> list[Operand | None]:
    """Unrolled: ``M`` (trip count, optional) and ``cond`` (optional) known at import,
    and the body's condition output known at import after each iteration."""
    f = c.f
    trips = c.static(0, "M")
    cond = c.static(1, "cond")
    limit = None if trips is None else int(trips.reshape(-1)[0])
    going = True if cond is None else bool(cond.reshape(-1)[0])
    if limit is None and cond is None:
        raise c.fail("has neither a trip count M nor a condition: it would never end")
    held = held_in(next((a.g for a in c.node.attribute if a.name == "body"), None))
    if held:  # ops that run on the host: so does the loop, its body a staged part (_staged)
        raise NeedsHost(f"its body holds {', '.join(held)}, which run on the host", c.out(0))
    carried = [c.input(i, f"v_initial[{i - 2}]") for i in range(2, c.num_inputs)]
    scans: list[list[Operand]] = []
    i = 0
    while going and (limit is None or i < limit):
        if i >= MAX_UNROLL:  # run from the host instead, iteration by iteration (_staged)
            raise NeedsHost(f"runs more than {MAX_UNROLL} iterations, the most rlx unrolls", c.out(0))
        outs = c.subgraph("body", [frozen(np.array(i, np.int64)), frozen(np.array(going)), *carried])
        if len(outs) < 1 + len(carried):
            raise c.fail(f"its body returns {len(outs)} values; it carries {len(carried)} and a condition")
        known = f.array(outs[0])
        if known is None:  # an exit on data: run from the host, iteration by iteration (_staged)
            raise NeedsHost("its condition is computed from data at run time (an early exit rlx cannot unroll)",
                            c.out(0))
        going = bool(np.asarray(known).reshape(-1)[0])
        carried = list(outs[1 : 1 + len(carried)])
        scans.append(list(outs[1 + len(carried):]))
        i += 1
    n_scan = len(scans[0]) if scans else max(c.num_outputs - len(carried), 0)
    if n_scan and not scans:
        raise c.fail("runs no iteration, so its scan outputs have no shape rlx can give them")
    stacked = [_stack(f, [it[k] for it in scans], 0) for k in range(n_scan)]
    return [*carried, *stacked]


def scan_layout(attr: Callable[[str], Any], n_in: int, n_out: int) -> tuple[list[int], ...]:
    """A Scan's input and output axes and directions (``attr(name)``: the attribute, None
    when absent), each defaulting to 0; ``ValueError`` unless one entry per scan input and
    output. Read by the converter and by the loader's Scan run from the host."""
    in_axes = [int(a) for a in (attr("scan_input_axes") or [0] * n_in)]
    in_dirs = [int(d) for d in (attr("scan_input_directions") or [0] * n_in)]
    out_axes = [int(a) for a in (attr("scan_output_axes") or [0] * n_out)]
    out_dirs = [int(d) for d in (attr("scan_output_directions") or [0] * n_out)]
    if len(in_axes) != n_in or len(in_dirs) != n_in or len(out_axes) != n_out or len(out_dirs) != n_out:
        raise ValueError("scan_input_axes/directions and scan_output_axes/directions need one entry per scan input "
                         "and output")
    return in_axes, in_dirs, out_axes, out_dirs


def _unroll(c: NodeContext, states: list[Operand], xs: Sequence[Operand], in_axes: Sequence[int],
            in_dirs: Sequence[int], steps: int, n_out: int) -> tuple[list[Operand], list[list[Operand]]]:
    """The body run ``steps`` times: each copy gets the states and the slice of every scan
    input at its step (from the end for a reverse direction); the final states and each
    step's scan output elements."""
    f = c.f
    per_step: list[list[Operand]] = []
    for t in range(steps):
        sliced = []
        for x, a, d in zip(xs, in_axes, in_dirs):
            s = f.shape(x)
            at = steps - 1 - t if d else t
            part = f.op("slice", x, starts=(at,), ends=(at + 1,), axes=(a,))
            sliced.append(f.op("reshape", part, shape=tuple(n for k, n in enumerate(s) if k != a)))
        outs = c.subgraph("body", [*states, *sliced])
        if len(outs) != len(states) + n_out:
            raise c.fail(f"its body returns {len(outs)} values, {len(states) + n_out} expected")
        states = list(outs[:len(states)])
        per_step.append(list(outs[len(states):]))
    return states, per_step


@converter("Scan")
def _scan(c: NodeContext) -> list[Operand | None]:
    """Unrolled over the scanned axis: each copy of the body gets the states and the
    slice of every scan input at its step; scan outputs are stacked along their axes."""
    if c.opset < 9:
        return _scan_8(c)
    f = c.f
    n_in = int(c.attr("num_scan_inputs", 0))
    if n_in < 1 or n_in > c.num_inputs:
        raise c.fail(f"num_scan_inputs must be 1 to {c.num_inputs}, got {n_in}")
    n_state = c.num_inputs - n_in
    states = [c.input(i, f"initial_state[{i}]") for i in range(n_state)]
    xs = [c.input(n_state + k, f"scan_input[{k}]") for k in range(n_in)]
    n_out = c.num_outputs - n_state
    try:
        in_axes, in_dirs, out_axes, out_dirs = scan_layout(c.attr, n_in, n_out)
    except ValueError as exc:
        raise c.fail(str(exc)) from None
    shapes = [f.shape(x) for x in xs]
    in_axes = [a % len(s) if s else a for a, s in zip(in_axes, shapes)]
    lengths = {s[a] for a, s in zip(in_axes, shapes)}
    if len(lengths) != 1:
        raise c.fail(f"its scan inputs have different lengths along their scan axes: {sorted(lengths)}")
    steps = lengths.pop()
    held = held_in(next((a.g for a in c.node.attribute if a.name == "body"), None))
    if steps > MAX_UNROLL or held:  # run from the host instead, step by step (_staged)
        why = f"its body holds {', '.join(held)}, which run on the host" if held else (
            f"scans {steps} steps, more than the {MAX_UNROLL} rlx unrolls")
        raise NeedsHost(why, c.out(0))
    if steps == 0 and n_out:
        raise c.fail("scans no step, so its scan outputs have no shape rlx can give them")
    states, per_step = _unroll(c, states, xs, in_axes, in_dirs, steps, n_out)
    results = []
    for k in range(n_out):
        items = [step[k] for step in per_step]
        if out_dirs[k]:
            items.reverse()
        rank = len(f.shape(items[0])) + 1
        results.append(_stack(f, items, out_axes[k] % rank))
    return [*states, *results]


def _scan_8(c: NodeContext) -> list[Operand | None]:
    """Scan 8 (opset 8, where Scan first appeared): batched. Input 0 is the optional ``sequence_lens``;
    every state and scan input has the batch on axis 0, the scan inputs their steps on
    axis 1; ``directions`` reverses scan inputs. Each batch item is unrolled on its own
    (the spec's loop over the batch) and the final states and scan outputs (batch, steps,
    ...) stacked on axis 0. Only sequences of the full length are read: ``sequence_lens``,
    when given, must be known at import and equal to the scan axis' length (shorter ones
    leave the outputs past them undefined, which rlx refuses). Never run from the host: the
    host's Scan step reads Scan 9 and later, so a Scan 8 too long to unroll is refused."""
    f = c.f
    n_in = int(c.attr("num_scan_inputs", 0))
    if n_in < 1 or n_in > c.num_inputs - 1:
        raise c.fail(f"num_scan_inputs must be 1 to {c.num_inputs - 1}, got {n_in}")
    n_state = c.num_inputs - 1 - n_in
    states = [c.input(1 + i, f"initial_state[{i}]") for i in range(n_state)]
    xs = [c.input(1 + n_state + k, f"scan_input[{k}]") for k in range(n_in)]
    n_out = c.num_outputs - n_state
    if n_out < 0:
        raise c.fail(f"has {c.num_outputs} outputs, fewer than its {n_state} states")
    dirs = [int(d) for d in (c.attr("directions") or [0] * n_in)]
    if len(dirs) != n_in:
        raise c.fail(f"directions needs one entry per scan input ({n_in}), got {len(dirs)}")
    shapes = [f.shape(x) for x in [*states, *xs]]
    if any(len(s) < 1 for s in shapes[:n_state]) or any(len(s) < 2 for s in shapes[n_state:]):
        raise c.fail("Scan 8 needs states with a batch axis and scan inputs with a batch and a scan axis, got "
                     f"shapes {[tuple(s) for s in shapes]}")
    batches = {s[0] for s in shapes}
    lengths = {s[1] for s in shapes[n_state:]}
    if len(batches) != 1 or len(lengths) != 1:
        raise c.fail(f"its states and scan inputs must share the batch size (axis 0) and the scan inputs the "
                     f"sequence length (axis 1), got shapes {[tuple(s) for s in shapes]}")
    batch, steps = batches.pop(), lengths.pop()
    lens = c.static(0, "sequence_lens")
    if lens is not None and (lens.dtype.kind not in "iu" or lens.size != batch or np.any(lens != steps)):
        raise c.fail(f"sequence_lens {lens.reshape(-1).tolist()} must give every one of the {batch} sequences the "
                     f"full length {steps}: shorter ones (undefined outputs past them) are not supported")
    held = held_in(next((a.g for a in c.node.attribute if a.name == "body"), None))
    if held:
        raise c.fail(f"its body holds {', '.join(held)}, which run on the host, and Scan 8 is not run from the "
                     "host; convert the model to opset 9 or later")
    if batch * steps > MAX_UNROLL:
        raise c.fail(f"scans {batch} x {steps} steps, more than the {MAX_UNROLL} rlx unrolls (Scan 8 is not run "
                     "from the host); convert the model to opset 9 or later")
    if batch == 0 or (steps == 0 and n_out):
        raise c.fail("scans no step, so its outputs have no shape rlx can give them")

    def item(x: Operand, b: int) -> Operand:
        s = f.shape(x)
        return f.op("reshape", f.op("slice", x, starts=(b,), ends=(b + 1,), axes=(0,)), shape=tuple(s[1:]))

    finals: list[list[Operand]] = []
    outputs: list[list[Operand]] = []
    for b in range(batch):
        last, per_step = _unroll(c, [item(s, b) for s in states], [item(x, b) for x in xs], [0] * n_in, dirs,
                                 steps, n_out)
        finals.append(last)
        outputs.append([_stack(f, [step[k] for step in per_step], 0) for k in range(n_out)])
    results = [_stack(f, [fin[i] for fin in finals], 0) for i in range(n_state)]
    results += [_stack(f, [out[k] for out in outputs], 0) for k in range(n_out)]
    return list(results)
