"""Shape buckets for backends that compile per static shape: one way to run symbolic graphs.

A backend whose programs are compiled for fixed shapes (XLA, CUDA graphs, OpenCL
programs) declares that it runs symbolic graphs itself by returning, from
``Backend.compile_symbolic``, ``bucketed(graph, options, self.compile)``. A new set of
sizes then runs on the program compiled for its *bucket* (each padded symbol rounded up to
the next power of two, or to the next size the user listed), with the inputs padded and
the outputs cut back: a new length inside a bucket never compiles. The graph is padded
where that is exact (``rlx_core.ir.padding``: masks where an op mixes positions, symbols
declined where none helps, those then run at their exact sizes).

Users choose the sizes with ``CompileOptions(extra={"buckets": ...})``:

- absent or ``"pow2"``: powers of two for every symbol that can be padded;
- ``"off"``: no buckets (each shape class is compiled, as for a static-only backend);
- a mapping of symbol to a list of sizes (``{"seq": [64, 128, 512]}``), ``"pow2"`` or
  ``"exact"``; a size past the last listed is rounded to a power of two; symbols not named
  get powers of two.

A run whose bucket sizes break one of the graph's constraints (a position table of 512
rows caps ``seq`` at 512) runs at its exact sizes. Buckets compiled are kept (at most
``MAX_BUCKETS``, least recently used dropped); ``report_notes`` lists each with when and
how long it took.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .errors import ConfigError
from .ir import Graph
from .ir.ops import SOURCE_OPS
from .ir.padding import Padded, pad_graph
from .ir.symbolic import evaluate
from .options import CompileOptions
from .plugin import Executable

__all__ = ["bucketed", "BucketedExecutable", "Ladder", "MAX_BUCKETS", "WASTE"]

log = logging.getLogger("rlx.buckets")

#: Buckets kept compiled per executable (least recently used dropped past it).
MAX_BUCKETS = 32
_HISTORY = 12  # bucket compiles listed in the report
#: A size met often is compiled on its own only where its bucket holds over this many
#: times its elements (``exact_compile_pays``): below it, the padding costs less than
#: an XLA compile would save over a server's life.
WASTE = 1.25


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else n


class Ladder:
    """The bucket of each size, per symbol (see the module for ``spec``)."""

    def __init__(self, spec: Any = None) -> None:
        self.off = False
        self._sizes: dict[str, tuple[int, ...] | None] = {}  # symbol -> sizes, None: exact
        where = "CompileOptions.extra['buckets']"
        if spec is None or spec == "pow2":
            return
        if spec == "off":
            self.off = True
            return
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{where} must be 'pow2', 'off' or a mapping of symbol to sizes, got {spec!r}")
        for name, sizes in spec.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ConfigError(f"{where}: a key must be a symbol's name, got {name!r}")
            if sizes == "pow2":
                continue
            if sizes == "exact":
                self._sizes[name] = None
                continue
            ok = isinstance(sizes, (list, tuple)) and sizes and all(
                isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 1 for s in sizes)
            if not ok:
                raise ConfigError(f"{where}[{name!r}] must be 'pow2', 'exact' or a list of sizes >= 1, got {sizes!r}")
            self._sizes[name] = tuple(sorted({int(s) for s in sizes}))

    def size(self, symbol: str, n: int) -> int:
        """The bucket of size ``n`` of ``symbol`` (``n`` itself for 0 or an exact symbol)."""
        if n <= 0 or symbol not in self._sizes:
            return _pow2(n) if n > 0 else n
        sizes = self._sizes[symbol]
        if sizes is None:
            return n
        for s in sizes:
            if s >= n:
                return s
        return _pow2(n)

    def exact(self) -> frozenset[str]:
        """Symbols the user asked to run at their exact sizes."""
        return frozenset(k for k, v in self._sizes.items() if v is None)

    def describe(self, symbol: str) -> str:
        sizes = self._sizes.get(symbol, ())
        return "powers of two" if not sizes else ", ".join(map(str, sizes)) + ", then powers of two"


def bucketed(graph: Graph, options: CompileOptions, compile_static: Callable[[Graph, CompileOptions], Executable],
             claims: Callable[[Any], Any] | None = None) -> BucketedExecutable | None:
    """An executable for every size of the symbolic ``graph`` (legalized for the backend)
    that runs each set of sizes on ``compile_static``'s program for its bucket, or ``None``
    where buckets are off or no symbol can be padded (the core then compiles each shape
    class). ``claims`` (the backend's) is asked of the nodes the padding adds, at the
    representative sizes: a backend that declines one gets ``None`` too."""
    ladder = Ladder(options.extra.get("buckets") if options.extra else None)
    if ladder.off:
        return None
    candidates = [s for s in graph.symbols if s not in ladder.exact()]
    padded = pad_graph(graph, candidates)
    if not padded.symbols:
        log.info("graph %r: no symbol can be padded to a bucket (%s); each shape class is compiled", graph.name,
                 "; ".join(f"{k}: {v}" for k, v in padded.declined.items()) or "no symbolic input dims")
        return None
    if claims is not None:
        from .ir.specialize import representative

        try:
            sample = padded.graph.specialize(representative(graph)[1])
        except Exception as exc:  # (sizes the padded graph refuses: still correct to decline)
            log.info("graph %r: its padded form does not specialize (%s); no buckets", graph.name, exc)
            return None
        for node in sample.nodes:
            if node.op not in SOURCE_OPS and claims(node) is not True:
                log.info("graph %r: the backend declines %s %s of the padded graph; no buckets", graph.name,
                         node.op, node.describe())
                return None
    return BucketedExecutable(padded, options, compile_static, ladder)


class BucketedExecutable(Executable):
    """Every size of a symbolic graph on programs compiled per bucket (see the module)."""

    def __init__(self, padded: Padded, options: CompileOptions,
                 compile_static: Callable[[Graph, CompileOptions], Executable], ladder: Ladder) -> None:
        self._padded, self._options, self._compile_static, self._ladder = padded, options, compile_static, ladder
        self._source = padded.source
        self._symbols = frozenset(padded.symbols)
        g = padded.graph
        self._input_dims = {g.node(i).name: g.node(i).shape for i in g.inputs if g.node(i).name not in padded.limits}
        self._limits = [(name, dim, np.dtype(padded.limit_dtypes[name])) for name, dim in padded.limits.items()]
        self._constraints = tuple(g.constraints)
        self._buckets: OrderedDict[tuple[tuple[str, int], ...], Executable] = OrderedDict()
        self._lock = threading.Lock()
        self._history: list[str] = []
        self.compiles = 0

    # ------------------------------------------------------------------ running
    def bucket_of(self, actual: Mapping[str, int]) -> dict[str, int]:
        """The sizes a run at ``actual`` is computed at: each padded symbol's bucket, the
        rest exact; the exact sizes where the buckets break a constraint of the graph."""
        sizes = {k: (self._ladder.size(k, n) if k in self._symbols and n > 0 else n) for k, n in actual.items()}
        if any(n == 0 for n in actual.values()) or not all(c.holds(sizes) for c in self._constraints):
            return dict(actual)
        return sizes

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        actual = self._source.bind({name: np.shape(a) for name, a in inputs.items()})
        sizes = self.bucket_of(actual)
        exe = self._program(sizes)
        feed: dict[str, Any] = {}
        for name, arr in inputs.items():
            target = tuple(evaluate(d, sizes) for d in self._input_dims[name])
            if target == arr.shape:
                feed[name] = arr
            else:
                buf = np.zeros(target, dtype=arr.dtype)
                buf[tuple(slice(0, n) for n in arr.shape)] = arr
                feed[name] = buf
        for name, dim, dtype in self._limits:
            feed[name] = np.asarray(evaluate(dim, actual), dtype=dtype)
        outs = exe.run(feed)
        if sizes == actual:
            return list(outs)
        return [_cut(np.asarray(out), cut, actual, sizes) for out, cut in zip(outs, self._padded.outputs)]

    def _program(self, sizes: Mapping[str, int]) -> Executable:
        key = tuple(sorted(sizes.items()))
        exe = self._buckets.get(key)
        if exe is not None:
            try:
                self._buckets.move_to_end(key)
            except KeyError:  # dropped by another thread meanwhile: still valid to run
                pass
            return exe
        with self._lock:
            exe = self._buckets.get(key)
            if exe is None:
                t0 = time.perf_counter()
                exe = self._compile_static(self._padded.graph.specialize(sizes), self._options)
                seconds = time.perf_counter() - t0
                self._buckets[key] = exe
                while len(self._buckets) > MAX_BUCKETS:
                    self._buckets.popitem(last=False)
                self.compiles += 1
                what = ", ".join(f"{k}={v}" for k, v in key)
                self._history.append(f"bucket {what}: compiled in {seconds * 1e3:.1f} ms at "
                                     f"{time.strftime('%H:%M:%S')}")
                del self._history[:-_HISTORY]
                log.info("graph %r: bucket %s compiled in %.1f ms", self._source.name, what, seconds * 1e3)
        return exe

    def exact_compile_pays(self, bindings: Mapping[str, int]) -> bool:
        """Whether sizes met often are worth a compile of their own (the core asks): only
        where their bucket computes over ``WASTE`` times the elements they need."""
        sizes = self.bucket_of(bindings)
        waste = 1.0
        for k in self._symbols:
            if bindings.get(k):
                waste *= sizes[k] / bindings[k]
        return waste > WASTE

    def buckets(self) -> list[dict[str, int]]:
        """The buckets compiled and kept, least recently used first."""
        return [dict(k) for k in self._buckets]

    # ------------------------------------------------------------------ the rest
    def set_param(self, name: str, value: np.ndarray) -> None:
        g = self._padded.graph
        nid = next(i for i in g.params if g.node(i).name == name)
        with self._lock:
            g.replace_value(nid, value)  # for buckets compiled later
            for key, exe in list(self._buckets.items()):
                try:
                    exe.set_param(name, value)
                except NotImplementedError:  # compiled again, with the new value, when next run
                    del self._buckets[key]

    def report_notes(self) -> list[str]:
        padded = self._padded
        lines = [f"buckets: {k} padded to {self._ladder.describe(k)}" for k in padded.symbols]
        lines += [f"buckets: {k} runs at its exact sizes ({why})" for k, why in padded.declined.items()]
        return lines + self._history


def _cut(out: np.ndarray, cut: Sequence[Any], actual: Mapping[str, int], sizes: Mapping[str, int]) -> np.ndarray:
    """A bucket's output cut back to the actual sizes (see ``Padded.outputs``)."""
    index, merged = [], False
    for dim in cut:
        if dim is None:
            index.append(slice(None))
        elif isinstance(dim, tuple):
            merged = True
            index.append(slice(None))
        else:
            index.append(slice(0, evaluate(dim, actual)))
    out = out[tuple(index)]
    if not merged:
        return out
    for axis in range(len(cut) - 1, -1, -1):  # each merged axis: split it, cut each factor, merge again
        factors = cut[axis]
        if not isinstance(factors, tuple):
            continue
        shape = out.shape
        split = tuple(evaluate(f, sizes) for f in factors)
        out = out.reshape(shape[:axis] + split + shape[axis + 1:])
        inner = (slice(None),) * axis + tuple(slice(0, evaluate(f, actual)) for f in factors)
        out = out[inner]
        out = out.reshape((*shape[:axis], -1, *shape[axis + 1:]))
    return out
