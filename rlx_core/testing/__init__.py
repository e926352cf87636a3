"""The conformance kit: prove that a backend keeps the plugin contract.

Any plugin's test suite runs it unchanged, three ways (as scikit-learn offers
``check_estimator``)::

    from rlx_core.testing import check_backend, iter_checks, parametrize_checks

    def test_my_backend():                      # one test, every failure listed
        check_backend(MyBackend())

    for name, check in iter_checks(MyBackend()):   # a generator: run them your way
        check()

    @parametrize_checks(MyBackend())            # one pytest test per check
    def test_conformance(check):
        check()

The checks: the backend's metadata (``api``), its ``probe``, ``supported_ops`` and
``claims``, its ``cost_model``, then one ``op:<name>`` check per claimed op — random
shapes, dtypes and attributes drawn by hypothesis, compiled and run on the backend, and
held to the float64 reference (``rlx_core.reference``) — and two about executables
(``set_param``, ``concurrent_runs``). When the probe says unavailable, every check that
needs the device is skipped with the probe's reason. See ``docs/conformance.md``.

Needs hypothesis for the op checks (``pip install 'rlx-core[testing]'``); importing this
module does not import it, and ``import rlx_core`` does not import this module.
"""

from __future__ import annotations

import time
import unittest
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..plugin import Backend
from ._checks import (
    _KNOWN,
    BACKEND_CHECKS,
    EXECUTABLE_CHECKS,
    CheckSkipped,
    _Context,
    check_any_size,
    op_check,
    runs_symbolic,
)
from ._loopback import LoopbackBackend, LoopbackExecutable
from ._precision import check_precisions

__all__ = [
    "check_backend",
    "iter_checks",
    "parametrize_checks",
    "CheckReport",
    "CheckResult",
    "CheckSkipped",
    "BoundCheck",
    "LoopbackBackend",
    "LoopbackExecutable",
]

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: ``"passed"``, ``"failed"`` or ``"skipped"``, with its message
    (the failure, the skip reason, or a short note on a pass)."""

    name: str
    outcome: str
    message: str = ""
    seconds: float = 0.0

    def __str__(self) -> str:
        return f"{self.outcome.upper():7} {self.name}" + (f": {self.message}" if self.message else "")


@dataclass(frozen=True)
class CheckReport:
    """Every check of one ``check_backend`` run, in the order they ran."""

    backend: str
    results: tuple[CheckResult, ...]

    def _with(self, outcome: str) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.results if r.outcome == outcome)

    @property
    def passed(self) -> tuple[CheckResult, ...]:
        return self._with(PASSED)

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        return self._with(FAILED)

    @property
    def skipped(self) -> tuple[CheckResult, ...]:
        return self._with(SKIPPED)

    @property
    def ok(self) -> bool:
        return not self.failed

    def __getitem__(self, name: str) -> CheckResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(f"no check named {name!r}; checks: {[r.name for r in self.results]}")

    def summary(self) -> str:
        head = (f"conformance of backend {self.backend!r}: {len(self.passed)} passed, {len(self.failed)} failed, "
                f"{len(self.skipped)} skipped")
        return "\n".join([head, *(f"  {r}" for r in self.results)])

    __str__ = summary


def _run_one(name: str, fn: Callable[[_Context], Any], ctx: _Context, expected: Mapping[str, str]) -> CheckResult:
    start = time.perf_counter()
    if name in expected:
        return CheckResult(name, SKIPPED, f"expected to fail: {expected[name]}")
    try:
        note = fn(ctx)
    except unittest.SkipTest as exc:
        return CheckResult(name, SKIPPED, str(exc), time.perf_counter() - start)
    except AssertionError as exc:
        return CheckResult(name, FAILED, str(exc) or "assertion failed", time.perf_counter() - start)
    except Exception as exc:
        msg = f"{ctx.who}: {type(exc).__name__}: {exc}"
        return CheckResult(name, FAILED, msg, time.perf_counter() - start)
    return CheckResult(name, PASSED, note or "", time.perf_counter() - start)


def _plan(backend: Backend, ops: Iterable[str] | None) -> list[tuple[str, Callable[[_Context], Any]]]:
    """Every check for ``backend``: metadata, one per claimed (or requested) op, executables."""
    plan: list[tuple[str, Callable[[_Context], Any]]] = list(BACKEND_CHECKS)
    try:
        claimed = backend.supported_ops()
        claimed = frozenset(str(o) for o in claimed) if isinstance(claimed, (set, frozenset)) else frozenset()
    except Exception:
        claimed = frozenset()
    wanted = sorted(claimed - {"input", "param", "constant"}) if ops is None else [str(o) for o in ops]
    for op in wanted:
        if op in claimed or op not in _KNOWN:
            plan.append((f"op:{op}", op_check(op)))
        else:
            plan.append((f"op:{op}", _not_claimed(op)))
    plan.extend(EXECUTABLE_CHECKS)
    if runs_symbolic(backend):  # only where the backend has the optional hook: others' reports are unchanged
        plan.append(("any_size", check_any_size))
    if getattr(type(backend), "precisions", Backend.precisions) is not Backend.precisions:  # likewise
        plan.append(("precisions", check_precisions))
    return plan


def _not_claimed(op: str) -> Callable[[_Context], Any]:
    def check(ctx: _Context) -> None:
        raise CheckSkipped(f"{ctx.who} does not claim {op!r} (composites are legalized into claimed ops)")

    return check


def iter_checks(
    backend: Backend,
    ops: Iterable[str] | None = None,
    *,
    max_examples: int = 25,
    seed: int = 0,
    expected_failures: Mapping[str, str] | None = None,
    probe_timeout: float = 10.0,
) -> Iterator[tuple[str, BoundCheck]]:
    """Yield ``(check_name, check)`` for every check of ``backend``.

    Calling ``check()`` runs it: it returns the ``CheckResult`` when the check passes,
    raises ``AssertionError`` with the failure, or ``CheckSkipped`` (a
    ``unittest.SkipTest``, which pytest reports as a skip) with the reason. ``ops``
    restricts the op checks to those ops (default: every op the backend claims);
    ``expected_failures`` maps check names to the reason they are known to fail, and
    skips them with that reason. The probe runs once, when the first check needs it.
    """
    ctx = _Context(backend, max_examples=max_examples, seed=seed, probe_timeout=probe_timeout)
    expected = dict(expected_failures or {})
    for name, fn in _plan(backend, ops):
        yield name, BoundCheck(name, fn, ctx, expected)


class BoundCheck:
    """One check of one backend, ready to run: what ``iter_checks`` yields.

    ``check()`` returns the ``CheckResult`` of a pass and raises on a failure or a skip,
    for test runners; ``check.result()`` always returns the ``CheckResult``.
    """

    def __init__(self, name: str, fn: Callable[[_Context], Any], ctx: _Context, expected: Mapping[str, str]) -> None:
        self.name = name
        self.__doc__ = fn.__doc__
        self._fn, self._ctx, self._expected = fn, ctx, expected

    def result(self) -> CheckResult:
        return _run_one(self.name, self._fn, self._ctx, self._expected)

    def __call__(self) -> CheckResult:
        result = self.result()
        if result.outcome == FAILED:
            raise AssertionError(f"check {self.name} failed: {result.message}")
        if result.outcome == SKIPPED:
            raise CheckSkipped(result.message)
        return result

    def __repr__(self) -> str:
        return f"<check {self.name} of {self._ctx.who}>"


def check_backend(
    backend: Backend,
    ops: Iterable[str] | None = None,
    *,
    max_examples: int = 25,
    seed: int = 0,
    expected_failures: Mapping[str, str] | None = None,
    probe_timeout: float = 10.0,
    raise_on_failure: bool = True,
) -> CheckReport:
    """Run every check of ``backend`` and return the ``CheckReport``.

    Raises ``AssertionError`` listing every failed check with its message (unless
    ``raise_on_failure=False``); skipped checks keep their reasons in the report.
    Arguments as for ``iter_checks``.
    """
    checks = iter_checks(backend, ops, max_examples=max_examples, seed=seed, expected_failures=expected_failures,
                         probe_timeout=probe_timeout)
    results = tuple(check.result() for _, check in checks)
    report = CheckReport(str(getattr(backend, "name", backend)), results)
    if raise_on_failure and report.failed:
        lines = [f"backend {report.backend!r} failed {len(report.failed)} of {len(results)} conformance checks:"]
        lines += [f"  - {r.name}: {r.message}" for r in report.failed]
        raise AssertionError("\n".join(lines))
    return report


def parametrize_checks(
    backend: Backend,
    ops: Iterable[str] | None = None,
    *,
    max_examples: int = 25,
    seed: int = 0,
    expected_failures: Mapping[str, str] | None = None,
    probe_timeout: float = 10.0,
) -> Any:
    """A ``pytest.mark.parametrize("check", ...)`` decorator: one test per check, with
    the check's name as the test id. The test calls ``check()``."""
    import pytest

    checks = list(iter_checks(backend, ops, max_examples=max_examples, seed=seed,
                              expected_failures=expected_failures, probe_timeout=probe_timeout))
    return pytest.mark.parametrize("check", [pytest.param(fn, id=name) for name, fn in checks])
