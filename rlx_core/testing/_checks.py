"""The checks of the conformance kit, each a function of one ``_Context``.

A check returns ``None`` or a short note when it passes, raises ``AssertionError`` with
a message naming the backend when it fails, and ``CheckSkipped`` with the reason when it
cannot run here (an unavailable device is a normal answer, not a failure).
"""

from __future__ import annotations

import itertools
import math
import threading
import unittest
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import reference
from ..cost import CostModel, estimate_graph_cost
from ..errors import PluginError
from ..ir import Graph, Node
from ..ir.ops import SOURCE_OPS, OpKind
from ..plugin import PLUGIN_API_VERSION, Availability, Backend, CompileOptions, Executable, runs_symbolic
from ._compare import mismatch


class CheckSkipped(unittest.SkipTest):
    """A check that cannot run here; pytest reports it as skipped with this reason."""


@dataclass
class _Context:
    """What every check of one kit run shares: the backend, the settings, one probe."""

    backend: Backend
    max_examples: int = 25
    seed: int = 0
    probe_timeout: float = 10.0
    _probe: Availability | BaseException | None = field(default=None, repr=False)
    _probe_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def who(self) -> str:
        return f"backend {getattr(self.backend, 'name', '?')!r}"

    def probe(self) -> Availability | BaseException:
        """Run ``probe()`` once, in a daemon thread so a hung probe cannot hang the kit."""
        with self._probe_lock:
            if self._probe is None:
                box: list[Any] = []

                def run() -> None:
                    try:
                        box.append(self.backend.probe())
                    except BaseException as exc:
                        box.append(exc)

                t = threading.Thread(target=run, name=f"rlx-kit-probe-{self.who}", daemon=True)
                t.start()
                t.join(self.probe_timeout)
                self._probe = box[0] if box else TimeoutError(f"probe() did not return in {self.probe_timeout:g} s")
            return self._probe

    def require_available(self) -> None:
        """Skip the calling check unless the probe said available."""
        got = self.probe()
        if isinstance(got, BaseException):
            raise CheckSkipped(f"{self.who}: probe() failed ({type(got).__name__}: {got})")
        if not isinstance(got, Availability):
            raise CheckSkipped(f"{self.who}: probe() returned {type(got).__name__}, not an Availability")
        if not got.available:
            raise CheckSkipped(f"{self.who} is unavailable here: {got.reason or '(no reason given)'}")

    def compile(self, graph: Graph) -> Executable:
        return self.backend.compile(graph, CompileOptions(device=self.backend.name))


# ----------------------------------------------------------------------------- metadata
def check_api(ctx: _Context) -> None:
    """name, label, priority and api_version are what the registry will accept."""
    from ..backends.registry import Registry

    b = ctx.backend
    assert isinstance(b, Backend), f"{b!r} is a {type(b).__name__}, not an rlx_core.Backend subclass instance"
    assert isinstance(b.label, str), f"{ctx.who}: label must be a str, got {type(b.label).__name__}"
    assert isinstance(b.api_version, int) and not isinstance(b.api_version, bool), (
        f"{ctx.who}: api_version must be an int, got {b.api_version!r}")
    try:
        Registry(entry_points=[], environ={}).register(b)  # the exact validation discovery applies
    except PluginError as exc:
        raise AssertionError(f"the registry would refuse this backend: {exc}") from None
    assert b.api_version == PLUGIN_API_VERSION, f"{ctx.who}: api_version {b.api_version} != {PLUGIN_API_VERSION}"


def check_probe(ctx: _Context) -> str:
    """probe() returns an Availability promptly; unavailable comes with a reason."""
    got = ctx.probe()
    if isinstance(got, BaseException):
        raise AssertionError(f"{ctx.who}: probe() raised {type(got).__name__}: {got} "
                             "(return Availability(False, reason) instead)")
    assert isinstance(got, Availability), f"{ctx.who}: probe() returned {got!r}, not an rlx_core.Availability"
    assert isinstance(got.reason, str), f"{ctx.who}: Availability.reason must be a str, got {got.reason!r}"
    assert got.available or got.reason.strip(), f"{ctx.who}: probe() says unavailable without a reason"
    assert all(isinstance(d, str) for d in got.devices), f"{ctx.who}: Availability.devices must be strs: {got.devices}"
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in got.versions.items()), (
        f"{ctx.who}: Availability.versions must map str to str: {got.versions}")
    return "available" if got.available else f"unavailable: {got.reason}"


def _supported(ctx: _Context) -> frozenset[str]:
    ops = ctx.backend.supported_ops()
    assert isinstance(ops, frozenset), f"{ctx.who}: supported_ops() must return a frozenset, got {type(ops).__name__}"
    bad = sorted(repr(o) for o in ops if not isinstance(o, str))
    assert not bad, f"{ctx.who}: supported_ops() holds non-str entries {', '.join(bad)}"
    return ops


def check_supported_ops(ctx: _Context) -> str:
    """supported_ops() is a frozenset of str; says which ops the kit will test."""
    ops = _supported(ctx)
    known = {o for o in ops if o in _KNOWN}
    return f"{len(known)} known ops claimed" + (f", plus {sorted(ops - known)}" if ops - known else "")


def _zoo() -> Graph:
    """A small graph with one node of many ops, to ask ``claims`` about."""
    g = Graph("claims_zoo")
    x = g.input("x", (2, 3), "float32")
    w = g.param("w", np.ones((3, 3), np.float32))
    h = g.relu(g.add(g.matmul(x, w), 1.0))
    s = g.softmax(g.reshape(g.transpose(h), (2, 3)))
    m = g.reduce_max(s, axes=-1, keepdims=True)
    g.set_outputs([g.where(g.cast(g.sub(s, m), "bool"), s, g.exp(g.neg(s))), g.div(g.cast(x, "int32"), 2)])
    return g.freeze()


def check_claims(ctx: _Context) -> None:
    """claims(node) answers bool or str, and never True for an op supported_ops() omits."""
    ops = _supported(ctx)
    for node in _zoo().nodes:
        if node.op in SOURCE_OPS:
            continue
        ans = ctx.backend.claims(node)
        assert isinstance(ans, (bool, str)), (
            f"{ctx.who}: claims({node.op} node) returned {ans!r}; expected True, False or a reason string")
        assert ans is not True or node.op.value in ops, (
            f"{ctx.who}: claims() accepts a {node.op} node, but supported_ops() does not list {node.op.value!r}")


# ----------------------------------------------------------------------------- cost model
def _cost_graph() -> Graph:
    g = Graph("cost_probe")
    x = g.input("x", (32, 64), "float32")
    w = g.param("w", np.zeros((64, 16), np.float32))
    g.set_outputs([g.relu(g.add(g.matmul(x, w), 1.0))])
    return g.freeze()


def check_cost_model(ctx: _Context) -> str:
    """cost_model() gives finite positive figures; bigger gemms run at least as fast."""
    model = ctx.backend.cost_model()
    assert isinstance(model, CostModel), f"{ctx.who}: cost_model() returned {model!r}, not an rlx_core.CostModel"
    assert model.device.split(":")[0] == ctx.backend.name, (
        f"{ctx.who}: cost_model().device is {model.device!r}, expected {ctx.backend.name!r}")
    for name in ("sgemm_gflops", "memory_bw_gbps"):
        v = getattr(model, name)
        assert math.isfinite(v) and v > 0, f"{ctx.who}: cost model {name} = {v!r}, expected a finite number > 0"
    for name in ("dispatch_overhead_ns", "roundtrip_overhead_ns", "transfer_bw_gbps"):
        v = getattr(model, name)
        assert math.isfinite(v) and v >= 0, f"{ctx.who}: cost model {name} = {v!r}, expected a finite number >= 0"
    assert isinstance(model.num_threads, int) and model.num_threads >= 1, (
        f"{ctx.who}: cost model num_threads = {model.num_threads!r}, expected an int >= 1")
    seconds = estimate_graph_cost(_cost_graph(), model)
    assert math.isfinite(seconds) and seconds > 0, f"{ctx.who}: estimate_graph_cost gave {seconds!r} s"
    sizes = (8, 64, 256, 1024, 4096)
    rates = [model.sgemm_gflops_at(n, n, n) for n in sizes]
    assert all(math.isfinite(r) and r > 0 for r in rates), f"{ctx.who}: sgemm_gflops_at gave {rates}"
    # Measured curves wobble; allow 10% between neighbours, none overall.
    dips = [(a, b) for a, b in itertools.pairwise(rates) if b < 0.9 * a]
    assert not dips and rates[-1] >= rates[0], (
        f"{ctx.who}: sgemm_gflops_at falls as problems grow: "
        + ", ".join(f"{n}^3: {r:.3g}" for n, r in zip(sizes, rates)))
    return f"{'calibrated' if model.calibrated else 'default'} model, {seconds * 1e6:.1f} us for a small MLP"


# ----------------------------------------------------------------------------- ops
def _run_case(ctx: _Context, graph: Graph, node: Node, inputs: Mapping[str, np.ndarray], describe: str,
              params: Mapping[str, np.ndarray] | None = None, exe: Executable | None = None,
              terms: int = 1, exact: bool = False) -> Executable:
    """Compile (unless ``exe``), run, and hold the result to the reference and the contract."""
    where = f"{ctx.who}, {describe}"
    try:
        exe = exe or ctx.compile(graph)
    except Exception as exc:
        raise AssertionError(f"{where}: compile raised {type(exc).__name__}: {exc}") from None
    pristine = {k: v.copy() for k, v in inputs.items()}
    try:
        outs = exe.run(inputs)
    except Exception as exc:
        raise AssertionError(f"{where}: run raised {type(exc).__name__}: {exc}") from None
    changed = sorted(k for k in inputs if not np.array_equal(inputs[k], pristine[k], equal_nan=True))
    assert not changed, f"{where}: run modified its input array(s) {changed}; inputs must be treated as read-only"
    assert isinstance(outs, (list, tuple)), f"{where}: run returned {type(outs).__name__}, expected a list of arrays"
    assert len(outs) == len(graph.outputs), f"{where}: run returned {len(outs)} outputs for {len(graph.outputs)}"
    refs = reference.evaluate(graph, pristine, params=params)
    for i, (got, ref, nid) in enumerate(zip(outs, refs, graph.outputs)):
        want = graph.node(nid)
        assert isinstance(got, np.ndarray), f"{where}: output {i} is a {type(got).__name__}, not a numpy array"
        assert got.shape == want.shape, f"{where}: output {i} has shape {got.shape}, expected {want.shape}"
        assert got.dtype == np.dtype(want.dtype), f"{where}: output {i} has dtype {got.dtype}, expected {want.dtype}"
        bad = mismatch(want.dtype, got, ref, terms=terms, exact=exact)
        assert bad is None, f"{where}: output {i} ({want.dtype}{list(want.shape)}) is wrong: {bad}"
    return exe


def _claimed(ctx: _Context, node: Node) -> bool | str:
    ans = ctx.backend.claims(node)
    assert isinstance(ans, (bool, str)), f"{ctx.who}: claims({node.op} node) returned {ans!r}, not bool or str"
    return ans


def op_check(op: str) -> Callable[[_Context], str | None]:
    """The check of one claimed op: random cases against the reference, with hypothesis."""

    def check(ctx: _Context) -> str | None:
        if op not in _KNOWN:
            raise CheckSkipped(f"no generator for op {op!r} (not an rlx op; test it in the plugin's own suite)")
        ctx.require_available()
        try:
            from hypothesis import HealthCheck, Verbosity, given, settings
        except ImportError:  # pragma: no cover - depends on the environment
            raise CheckSkipped("the op checks need hypothesis: pip install 'rlx-core[testing]'") from None
        from ._case_base import EXACT_OPS
        from ._cases import op_cases as draw_cases

        kind = OpKind(op)
        declined: list[str] = []
        ran = [0]

        # The dtypes the backend declares (Backend.dtypes): a backend reading the extended
        # integers proves its claims on them too; one that declares nothing sees the six.
        declared = getattr(ctx.backend, "dtypes", None)
        dtypes = frozenset(declared) if isinstance(declared, (set, frozenset)) else None
        listed = getattr(ctx.backend, "op_extensions", None)  # and the op extensions it lists
        extensions = frozenset(listed) if isinstance(listed, (set, frozenset)) else frozenset()
        try:
            cases = draw_cases(kind, ctx.seed, dtypes, extensions)
        except ValueError as exc:  # a backend that declares none of the dtypes this op takes
            raise CheckSkipped(f"{ctx.who}: {exc}") from None

        def op_cases(kind: OpKind, seed: int) -> Any:
            # derandomize seeds hypothesis from the test's source, decorators included: the
            # decorator below reads as it always has, so a backend of the six draws the very
            # cases it drew before the extended dtypes existed.
            return cases

        @settings(max_examples=ctx.max_examples, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                  verbosity=Verbosity.quiet)
        @given(case=op_cases(kind, ctx.seed))
        def run(case: Any) -> None:
            try:
                graph, node = case.build()
            except Exception as exc:
                raise AssertionError(f"the kit built an invalid case {case.describe()}: {exc} (a bug in "
                                     "rlx_core.testing, please report it)") from None
            ans = _claimed(ctx, node)
            if ans is not True:
                declined.append(ans or "declined")
                return
            ran[0] += 1
            _run_case(ctx, graph, node, case.run_inputs(), case.describe(), terms=case.terms, exact=kind in EXACT_OPS)

        run()
        if not ran[0]:
            raise CheckSkipped(f"{ctx.who} declined every generated {op} node (e.g. {declined[0]!r})")
        if declined:
            return f"{ran[0]} cases passed; {len(declined)} declined by claims() (e.g. {declined[0]!r})"
        return f"{ran[0]} cases passed"

    check.__name__ = check.__qualname__ = f"check_op_{op}"
    check.__doc__ = f"Every generated {op} case matches the reference (values, shape, dtype, inputs untouched)."
    return check


# ----------------------------------------------------------------------------- executables
_PARAM_OPS = (OpKind.ADD, OpKind.MUL, OpKind.SUB, OpKind.MAXIMUM, OpKind.MATMUL)


def _param_graph(op: OpKind) -> tuple[Graph, Node]:
    g = Graph(f"check_set_param_{op.value}")
    x = g.input("x", (3, 4), "float32")
    w = g.param("w", np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4) if op is OpKind.MATMUL
                else np.linspace(-1, 1, 4, dtype=np.float32))
    out = getattr(g, op.value)(x, w)
    g.set_outputs([out])
    return g.freeze(), g.node(out)


def _first_claimed(ctx: _Context) -> tuple[Graph, Node]:
    ops = _supported(ctx)
    for op in _PARAM_OPS:
        if op.value in ops:
            graph, node = _param_graph(op)
            if _claimed(ctx, node) is True:
                return graph, node
    raise CheckSkipped(f"{ctx.who} claims none of {[o.value for o in _PARAM_OPS]} on float32")


def check_set_param(ctx: _Context) -> str | None:
    """Executable.set_param either swaps the weight (later runs use it) or is not implemented."""
    ctx.require_available()
    graph, node = _first_claimed(ctx)
    x = {"x": np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)}
    exe = _run_case(ctx, graph, node, x, f"{node.op} with param 'w'")
    new = (np.asarray(graph.value(graph.params[0])) * -3 + 0.5).astype(np.float32)
    try:
        exe.set_param("w", new.copy())
    except NotImplementedError:
        raise CheckSkipped(f"{ctx.who}: Executable.set_param is not implemented (the core recompiles)") from None
    _run_case(ctx, graph, node, x, f"{node.op} after set_param('w')", params={"w": new}, exe=exe)
    return None


def check_concurrent_runs(ctx: _Context) -> str | None:
    """One executable run from several threads at once gives every thread the right answer."""
    ctx.require_available()
    graph, node = _first_claimed(ctx)
    exe = ctx.compile(graph)
    errors: list[str] = []

    def worker(i: int) -> None:
        x = {"x": np.full((3, 4), i - 2.5, np.float32)}
        for _ in range(5):
            try:
                _run_case(ctx, graph, node, x, f"{node.op} from thread {i}", exe=exe)
            except AssertionError as exc:
                errors.append(str(exc))
                return

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    return None


def check_any_size(ctx: _Context) -> str | None:
    """A backend that runs symbolic graphs itself (``compile_symbolic``): its executable for
    a one-op graph of symbolic rows runs 1, 3 and 7 rows with the reference's answers, each
    output of the shape the symbolic graph gives at that size."""
    ctx.require_available()
    if not runs_symbolic(ctx.backend):
        raise CheckSkipped(f"{ctx.who} does not run symbolic graphs itself (no compile_symbolic): the core hands "
                           "it one specialization per shape class")
    static, node = _first_claimed(ctx)
    g = Graph(f"check_any_size_{node.op.value}")
    x = g.input("x", ("rows", 4), "float32")
    out = getattr(g, node.op.value)(x, g.param("w", np.asarray(static.value(static.params[0]))))
    g.set_outputs([out])
    g.freeze()
    where = f"{ctx.who}, compile_symbolic of {node.op} over ('rows', 4)"
    try:
        exe = ctx.backend.compile_symbolic(g, CompileOptions(device=ctx.backend.name))
    except Exception as exc:
        raise AssertionError(f"{where} raised {type(exc).__name__}: {exc}") from None
    if exe is None:
        raise CheckSkipped(f"{ctx.who}: compile_symbolic declined a one-op graph (it may decline any)")
    assert callable(getattr(exe, "run", None)), f"{where} returned {type(exe).__name__}, not an Executable"
    for rows in (1, 3, 7):
        feeds = {"x": np.linspace(-2, 2, rows * 4, dtype=np.float32).reshape(rows, 4)}
        sized = g.specialize({"rows": rows}).freeze()
        _run_case(ctx, sized, sized.node(out.id), feeds, f"{node.op} at {rows} row(s) on the executable for every "
                  "size", exe=exe)
    return None


_KNOWN = frozenset(op.value for op in OpKind) - {op.value for op in SOURCE_OPS}

#: The checks that are not per op, in the order they run.
BACKEND_CHECKS: tuple[tuple[str, Callable[[_Context], str | None]], ...] = (
    ("api", check_api),
    ("probe", check_probe),
    ("supported_ops", check_supported_ops),
    ("claims", check_claims),
    ("cost_model", check_cost_model),
)
EXECUTABLE_CHECKS: tuple[tuple[str, Callable[[_Context], str | None]], ...] = (
    ("set_param", check_set_param),
    ("concurrent_runs", check_concurrent_runs),
)
