"""The plugin contract: the one hook, the ``Backend`` base class and what it returns.

Read this module and you know everything a backend may do. A plugin is a distribution
with an entry point in group ``rlx.backends`` pointing at a module (or object) that
implements the ``rlx_backends`` hook; each ``Backend`` it returns is validated when the
registry loads it (see ``registry.py``).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pluggy

from .cost import CostModel
from .errors import ConfigError
from .ir.dtypes import CONTRACT_DTYPES as CONTRACT_DTYPES
from .ir.dtypes import DTYPES as DTYPES
from .ir.dtypes import EXTENDED_DTYPES as EXTENDED_DTYPES
from .ir.dtypes import STORAGE_DTYPES as STORAGE_DTYPES
from .ir.ops import OP_EXTENSIONS as OP_EXTENSIONS
from .ir.ops import OpKind
from .options import PASS_NAMES as PASS_NAMES
from .options import PRECISIONS as PRECISIONS
from .options import CompileOptions as CompileOptions

if TYPE_CHECKING:
    from .ir import Graph, Node

#: What backends build with, beyond the classes below: re-exported here (resolved on
#: first use, so that importing the contract stays cheap and free of import circles),
#: so that a plugin imports ``rlx_core``, ``rlx_core.plugin``, ``rlx_core.ir``,
#: ``rlx_core.ir.ops``, ``rlx_core.errors`` and ``rlx_core.testing`` only (import-linter
#: holds every plugin to that in ``nox -s lint``).
_KIT: dict[str, str] = {
    # The fused elementwise program of ``fused_elementwise`` nodes (``internal_types.py``).
    "Instruction": "rlx_core.ir.internal_types",
    "make_instruction": "rlx_core.ir.internal_types",
    "live_instructions": "rlx_core.ir.internal_types",
    "program_types": "rlx_core.ir.internal_types",
    "ACTIVATION_OPS": "rlx_core.ir.internal_types",
    # ``fused_conv``: which of its attributes and inputs are the convolution's; which
    # outputs a convolution's tap reads the image at.
    "CONV_ATTRS": "rlx_core.ir.internal_types",
    "conv_inputs": "rlx_core.ir.internal_types",
    "tap_reach": "rlx_core.ir.internal_types",
    # dtypes, caches, calibration, isolation.
    "itemsize": "rlx_core.ir.dtypes",
    "JsonCache": "rlx_core.cache",
    "cache_dir": "rlx_core.cache",
    "tag_cache_dir": "rlx_core.cache",
    "calibrate_backend": "rlx_core.calibration",
    "save_calibration": "rlx_core.calibration",
    "in_isolation_child": "rlx_core.backends.isolation",
    # The one timer (``rlx_core/timer.py``), for a backend choosing between kernels on this host.
    "best_of": "rlx_core.timer",
    "per_call": "rlx_core.timer",
}

__all__ = [
    "PLUGIN_API_VERSION",
    "ENTRY_POINT_GROUP",
    "hookspec",
    "hookimpl",
    "RlxBackendSpec",
    "Availability",
    "CompileOptions",
    "PRECISIONS",
    "Executable",
    "Backend",
    "Setting",
    "ShapeFamily",
    "shape_family",
    "runs_symbolic",
    "CONTRACT_DTYPES",
    "EXTENDED_DTYPES",
    "STORAGE_DTYPES",
    "DTYPES",
    "OP_EXTENSIONS",
    *sorted(_KIT),  # resolved by __getattr__ below
]

#: Bumped only when the contract below changes incompatibly; a backend declaring another
#: number is refused with both numbers in the message.
PLUGIN_API_VERSION = 1
ENTRY_POINT_GROUP = "rlx.backends"

hookspec = pluggy.HookspecMarker("rlx")
hookimpl = pluggy.HookimplMarker("rlx")


class RlxBackendSpec:
    """The hook specification (pluggy) — the whole plugin surface."""

    @hookspec
    def rlx_backends(self) -> list[Backend]:  # type: ignore[empty-body]
        """Return the backends this plugin provides.

        Must be cheap: no heavy imports (cupy, jax, pyopencl), no device work. Those
        belong in ``Backend.probe`` and ``Backend.compile``, which run only when needed.
        """


@dataclass(frozen=True)
class Availability:
    """A probe's answer. Unavailable with a reason is a normal answer, not a failure.

    ``devices`` lists the device strings this backend can address here (``["cuda:0",
    "cuda:1"]``), ``versions`` the library and driver versions it found.
    ``memory_bytes`` is what the device can give one graph, as measured by the probe (a
    GPU's free memory); ``None`` for a device that computes in host memory or cannot
    tell. Placement does not put a graph on a device that cannot hold it (``memory.py``).
    """

    available: bool
    reason: str = ""
    devices: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    memory_bytes: int | None = None

    def __bool__(self) -> bool:
        return self.available


_SETTING_NAME = re.compile(r"RLX_[A-Z0-9_]+")


@dataclass(frozen=True)
class Setting:
    """One environment variable and how its text becomes a value.

    ``name`` is ``RLX_`` and upper-case letters, digits and ``_``; ``doc`` is one line
    saying what it does, what it accepts and its default (``rlx devices --explain``).
    The text (stripped; unset or blank means ``default``) is turned into a value by
    ``choices`` — accepted words, matched case-insensitively, to their values: the
    simplest way to be strict — or else by ``parse``, a function of the text that
    returns the value or raises ``ValueError`` saying what it accepts (a ``ConfigError``
    passes through as it is). Either way a bad value is a ``ConfigError`` naming the
    variable, the value and what is accepted. ``owner`` is the distribution that reads
    the variable; the core fills it in for a plugin's settings.
    """

    name: str
    doc: str
    parse: Callable[[str], Any] | None = None
    choices: Mapping[str, Any] | None = None
    default: Any = None
    owner: str = ""
    _lookup: Mapping[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _SETTING_NAME.fullmatch(self.name):
            raise ValueError(f"Setting name {self.name!r}: expected RLX_ and upper-case letters, digits or '_'")
        if not isinstance(self.doc, str) or not self.doc.strip() or "\n" in self.doc:
            raise ValueError(f"Setting {self.name}: doc must be one non-empty line")
        if (self.parse is None) == (self.choices is None):
            raise ValueError(f"Setting {self.name}: give exactly one of parse and choices")
        if self.choices is not None:
            if not self.choices or not all(isinstance(k, str) and k.strip() for k in self.choices):
                raise ValueError(f"Setting {self.name}: choices must map non-empty words to values")
            object.__setattr__(self, "_lookup", {k.strip().lower(): v for k, v in self.choices.items()})

    @property
    def accepted(self) -> str:
        """The accepted words, for messages (``""`` for a setting with a ``parse``)."""
        return ", ".join(self.choices) if self.choices is not None else ""

    def read(self, environ: Mapping[str, str] | None = None) -> Any:
        """The value the environment gives (``os.environ`` by default)."""
        raw = (os.environ if environ is None else environ).get(self.name, "")
        return self.default if not raw.strip() else self.parse_text(raw)

    def parse_text(self, raw: str) -> Any:
        """The value of ``raw`` (not blank); ``ConfigError`` naming the variable, the
        value and what is accepted when it is malformed."""
        token = raw.strip()
        if self.choices is not None:
            try:
                return self._lookup[token.lower()]
            except KeyError:
                raise ConfigError(f"{self.name}: {token!r} is not accepted; expected one of {self.accepted}") from None
        assert self.parse is not None
        try:
            return self.parse(token)
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(f"{self.name}: {token!r} is not accepted: {exc}") from None


class Executable:
    """A graph compiled for one device. Subclasses implement ``run``.

    ``run`` receives validated arrays (right names, shapes and dtypes) that it must not
    modify, and returns one new array per graph output; the core checks the count, shapes
    and dtypes. ``run`` may be called from several threads at once.
    """

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    #: True when ``run`` takes device arrays (CuPy arrays, torch CUDA tensors) as they are:
    #: the core then checks them by shape and dtype instead of converting them to numpy.
    accepts_device_inputs: ClassVar[bool] = False

    def set_param(self, name: str, value: np.ndarray) -> None:
        """Swap a param's array in place. Optional: raise ``NotImplementedError`` (the
        default) and the core recompiles instead."""
        raise NotImplementedError

    def run_dlpack(self, inputs: Mapping[str, Any]) -> list[Any]:
        """``run``, with each output left where the device computed it, as a ``__dlpack__``
        producer (``CompiledGraph.run(output="dlpack")``). Optional: the default returns
        ``run``'s numpy arrays (host memory, itself a DLPack producer)."""
        return self.run(inputs)

    def report_notes(self) -> list[str]:
        """Lines for the compile report: what the backend wants said about this compile (a
        thread policy, XLA's compile time). Optional: the default says nothing."""
        return []


class Backend:
    """Base class of every backend. Subclasses set ``name`` and implement ``probe``,
    ``supported_ops`` and ``compile``; the rest has defaults.

    Instances must be cheap to create: the registry creates them at discovery, before
    anyone asks for the device.
    """

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""
    priority: ClassVar[int] = 0
    api_version: ClassVar[int] = PLUGIN_API_VERSION
    #: True for a backend whose compiler fuses elementwise chains by itself (XLA): the
    #: ranking then prices such chains as one memory pass, as the backend will run them,
    #: although the backend does not claim the core's ``fused_elementwise`` op.
    fuses_elementwise: ClassVar[bool] = False
    #: The dtypes this backend reads and computes (a subset of ``rlx_core.ir.dtypes.DTYPES``).
    #: The default is the contract's six (float32 float16 float64 int32 int64 bool). The
    #: core never compiles for a backend, nor asks its ``claims`` about, a node whose
    #: value or inputs have another dtype: legalization refuses such a node first, naming
    #: the dtype, so placement moves the graph (or that part of it) elsewhere. A backend
    #: opts into the extended integers (``rlx_core.ir.dtypes.EXTENDED_DTYPES``: int8 uint8
    #: int16 uint16 uint32 uint64) by listing them here, and the conformance kit then tests
    #: its claimed ops on them too; likewise into the storage formats
    #: (``rlx_core.ir.dtypes.STORAGE_DTYPES``: bfloat16, the float8s, float4, 4- and 2-bit ints),
    #: which only cast and the ops that move values take, as numpy arrays of ``ml_dtypes``.
    dtypes: ClassVar[frozenset[str]] = CONTRACT_DTYPES
    #: The optional op attributes beyond the contract this backend honours, as ``"op.attr"``
    #: (``rlx_core.ir.ops.OP_EXTENSIONS``, e.g. ``"attention.nan_to_zero"``). The core hands
    #: a node carrying one only to a backend that lists it: for any other, legalization
    #: rewrites it into its decomposition and the passes never make it, so a plugin
    #: written before the attribute existed never meets it. The conformance kit tests what
    #: a backend lists.
    op_extensions: ClassVar[frozenset[str]] = frozenset()

    def probe(self) -> Availability:
        """Run a tiny real computation; return why not when this backend cannot run here."""
        raise NotImplementedError(f"backend {self.name!r} does not implement probe()")

    def probed(self, answer: Availability) -> None:
        """Told the answer of a probe that ran in a child process (optional; default: nothing).

        The core probes entry-point backends in a child (``isolation.py``), so what a
        ``probe`` learns about the host (which platform JAX started, say) stays there;
        a backend whose ``claims`` or ``default_cost_model`` depend on it reads it back
        from ``answer.versions`` here. Called once per probe, in the calling process."""

    def supported_ops(self) -> frozenset[str]:
        """The ops (``OpKind`` values or third-party strings) this backend claims."""
        raise NotImplementedError(f"backend {self.name!r} does not implement supported_ops()")

    def claims(self, node: Node) -> bool | str:
        """Whether this backend runs ``node`` of a legalized graph; a string says why not."""
        return node.op in self.supported_ops()

    def cost_model(self) -> CostModel:
        """The calibrated model when one is cached for this host, else ``default_cost_model``.

        Backends usually override ``default_cost_model`` only, and get calibration
        caching for free.
        """
        from .calibration import cached_cost_model

        return cached_cost_model(self) or self.default_cost_model()

    def default_cost_model(self) -> CostModel:
        """Uncalibrated figures for this kind of device (cheap: no measurement)."""
        return CostModel(device=self.name, source="rlx-core generic defaults")

    def calibrate(self, quick: bool = False) -> CostModel:
        """Measure this host and persist the model (see ``rlx_core.calibration``)."""
        from .calibration import calibrate_backend

        return calibrate_backend(self, quick=quick)

    def skipped_passes(self) -> frozenset[str]:
        """Passes of the core's pipeline (names as ``CompileOptions.disable`` takes them)
        that this backend's compiles here are better without (optional; default none).

        A rewrite that pays under one way of running a graph may cost under another: the
        core's ``conv_scale`` moves a squeeze-excitation gate into a convolution's weights,
        cheaper for a GEMM over NCHW data, but a convolution with weights computed per run
        cannot keep a library's pre-reordered weights. Asked once per pipeline, cheaply
        (no device work); the answer joins the user's ``disable``."""
        return frozenset()

    def precisions(self) -> frozenset[str]:
        """The reduced precisions (``PRECISIONS`` other than ``fp32``) this backend honours
        on this host when ``CompileOptions.precision`` allows one (optional; default none).

        Declare a format only where the hardware computes it faster than float32 (a CPU
        without bfloat16 units rounds and gains nothing): the core says in the compile
        report whether the device took the permission, and the conformance kit checks a
        declared format's products against the float64 reference within that format's
        rounding. A backend that declares nothing computes float32 whatever was allowed,
        which is always correct. Asked cheaply (no device work), after the probe."""
        return frozenset()

    def compile(self, graph: Graph, options: CompileOptions) -> Executable:
        """Compile a graph that is already legalized for this backend."""
        raise NotImplementedError(f"backend {self.name!r} does not implement compile()")

    def compile_symbolic(self, graph: Graph, options: CompileOptions) -> Executable | None:
        """One executable for every size of a legalized graph with symbolic dims, or
        ``None`` (the default) to be handed each shape class specialized instead.

        This is how a backend declares that it runs symbolic graphs itself (kernels that
        read their sizes at run time, shape buckets): the core calls it once per graph and
        device, with the graph lowered once (legalize, optimize, fuse ran on the symbolic
        form; ``claims`` was asked at the representative sizes), and then runs every new
        set of sizes on the executable it returns, with no compile. ``run`` gets inputs
        whose sizes satisfy the graph's shape rules and constraints (checked by the core,
        ``Graph.bind``) and returns outputs of the shapes the graph's symbolic shapes
        evaluate to. A backend returns ``None`` for a graph it would serve worse this way
        (it may say why in its log); an API-1 plugin has no such method and is handed
        specializations, unchanged. Sizes met often may still be compiled on their own
        (a static plan is faster where sizes recur): the core decides that
        (``rlx_core.compiler.dynamic``)."""
        return None

    def settings(self) -> Sequence[Setting]:
        """The ``RLX_*`` environment variables this backend reads (optional; default none).

        Declared, they join rlx-core's settings table: every ``rlx`` command parses them
        before any work (a bad value is one error line naming the variable, the value and
        what is accepted), ``rlx devices --explain`` lists them with this backend's
        distribution as owner, and a typo of one is warned about. Read them in the
        backend with ``setting.read()``, so that a value means the same there. Cheap: no
        heavy imports, no device work (it is asked before every command). Backends of
        one distribution may return the same settings; each variable is listed once.
        """
        return ()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} priority={self.priority}>"


def runs_symbolic(backend: Backend) -> bool:
    """Whether ``backend`` runs symbolic graphs itself: it implements the optional
    ``Backend.compile_symbolic`` (``rlx devices --explain`` says so; the conformance kit then
    checks it)."""
    method = getattr(type(backend), "compile_symbolic", None)
    return method is not None and method is not Backend.compile_symbolic


class ShapeFamily:
    """The compiles of one symbolic graph, one per shape class, and what they may share.

    A backend that does not run symbolic graphs itself is handed one specialization per
    new set of sizes (``rlx_core.compiler.dynamic``). Each such compile runs inside the
    graph's family (``shape_family()`` answers it during ``Backend.compile``; ``None``
    for a compile of its own), so that a backend can keep in ``shared`` what is the same
    at every size: a writable copy of a weight, a weight laid out for a kernel. Keys are
    the backend's own; a key must name everything the value depends on (a layout chosen
    for one size is not another size's). The family lives as long as the compiled
    graph, and ``set_param`` reaches every copy, so a shared weight refilled in place
    by one copy is what the others hold too. Compiles of one family are serialized by
    the core; ``lock`` guards ``shared`` for a backend that also reads it from its runs.
    """

    def __init__(self) -> None:
        self.shared: dict[Any, Any] = {}
        self.lock = threading.Lock()

    @contextmanager
    def compiling(self) -> Iterator[ShapeFamily]:
        """The block in which ``shape_family()`` answers this family."""
        token = _FAMILY.set(self)
        try:
            yield self
        finally:
            _FAMILY.reset(token)

    def __repr__(self) -> str:
        return f"<ShapeFamily: {len(self.shared)} shared value(s)>"


_FAMILY: ContextVar[ShapeFamily | None] = ContextVar("rlx_shape_family", default=None)


def shape_family() -> ShapeFamily | None:
    """The ``ShapeFamily`` of the compile now running (see the class), else ``None``."""
    return _FAMILY.get()


# Ops every backend supports without claiming them: the core feeds sources itself.
SOURCE_OP_NAMES: frozenset[str] = frozenset({OpKind.INPUT.value, OpKind.PARAM.value, OpKind.CONSTANT.value})


def __getattr__(name: str) -> Any:
    """The backend kit (``_KIT``), imported on first use and then kept in this module."""
    module = _KIT.get(name)
    if module is None:
        raise AttributeError(f"module 'rlx_core.plugin' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # the kit's real types, for type checkers (``X as X``: a re-export)
    from .backends.isolation import in_isolation_child as in_isolation_child
    from .cache import JsonCache as JsonCache
    from .cache import cache_dir as cache_dir
    from .cache import tag_cache_dir as tag_cache_dir
    from .calibration import calibrate_backend as calibrate_backend
    from .calibration import save_calibration as save_calibration
    from .ir.dtypes import itemsize as itemsize
    from .ir.internal_types import ACTIVATION_OPS as ACTIVATION_OPS
    from .ir.internal_types import CONV_ATTRS as CONV_ATTRS
    from .ir.internal_types import Instruction as Instruction
    from .ir.internal_types import conv_inputs as conv_inputs
    from .ir.internal_types import live_instructions as live_instructions
    from .ir.internal_types import make_instruction as make_instruction
    from .ir.internal_types import program_types as program_types
    from .ir.internal_types import tap_reach as tap_reach
