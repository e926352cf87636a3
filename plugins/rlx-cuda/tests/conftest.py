"""Fixtures of the rlx-cuda tests: a host C++ compiler for the generated kernel bodies,
and a skip for tests that need a working GPU.

The host harness compiles a CuPy ``ElementwiseKernel`` body as plain C++ with a few
shims (CuPy's ``float16`` as ``_Float16``, ``rsqrtf``, the bit-cast intrinsics) and runs
it over every output index, so the generated source is executed and checked on hosts
without a GPU. Inputs are broadcast to the output's shape first, as CuPy does.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

CXX = shutil.which("g++") or shutil.which("c++")

_SHIMS = r"""
#include <cmath>
#include <cstring>
using std::isnan;
struct float16 {
  _Float16 d;
  float16() {}
  float16(float v) : d((_Float16)v) {}
  operator float() const { return (float)d; }
};
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __int_as_float(int v) { float f; std::memcpy(&f, &v, 4); return f; }
static inline double __longlong_as_double(long long v) { double f; std::memcpy(&f, &v, 8); return f; }
"""

CTYPES = {"float16": "float16", "float32": "float", "float64": "double", "int32": "int", "int64": "long long",
          "bool": "bool"}


@dataclass
class HostKernel:
    """One body to compile: typed scalar (per-element) inputs, raw (pointer) inputs, one output."""

    name: str
    body: str
    elem_inputs: Sequence[tuple[str, str]] = ()  # (name, dtype): one value per output index
    raw_inputs: Sequence[tuple[str, str]] = ()  # (name, dtype): the whole array, indexed by the body
    out_dtype: str = "float32"
    error_flag: bool = False

    def source(self) -> str:
        params = ["long long n_"]
        params += [f"const void* p_{n}" for n, _ in self.elem_inputs]
        params += [f"const void* r_{n}" for n, _ in self.raw_inputs]
        params += ["void* p_out_", "int* rlx_err"]
        lines = [f'extern "C" void {self.name}({", ".join(params)}) {{']
        for n, d in self.raw_inputs:
            lines.append(f"  const {CTYPES[d]}* {n} = (const {CTYPES[d]}*)r_{n};")
        lines.append("  for (long long i = 0; i < n_; ++i) {")
        for n, d in self.elem_inputs:
            lines.append(f"    const {CTYPES[d]} {n} = ((const {CTYPES[d]}*)p_{n})[i];")
        lines.append(f"    {CTYPES[self.out_dtype]}& out = (({CTYPES[self.out_dtype]}*)p_out_)[i];")
        lines.append("    { " + self.body.replace("\n", "\n      ") + " }")
        lines.append("  }\n}")
        return "\n".join(lines)


class HostCompiler:
    Kernel = HostKernel

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.count = 0

    def build(self, kernels: Sequence[HostKernel]) -> ctypes.CDLL:
        """Compile every kernel into one shared library (one compiler run)."""
        self.count += 1
        src = self.workdir / f"kernels{self.count}.cpp"
        lib = self.workdir / f"kernels{self.count}.so"
        src.write_text(_SHIMS + "\n\n".join(k.source() for k in kernels))
        done = subprocess.run([CXX, "-std=c++17", "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)],
                              capture_output=True, text=True)
        if done.returncode:
            raise AssertionError(f"the generated kernels do not compile:\n{done.stderr[:4000]}")
        return ctypes.CDLL(str(lib))

    @staticmethod
    def run(lib: ctypes.CDLL, kernel: HostKernel, out_shape: tuple[int, ...], elem: Sequence[np.ndarray] = (),
            raw: Sequence[np.ndarray] = ()) -> tuple[np.ndarray, int]:
        """Run ``kernel`` over ``out_shape``; returns the output and the error flag."""
        full = [np.ascontiguousarray(np.broadcast_to(a, out_shape)) for a in elem]
        raws = [np.ascontiguousarray(a) for a in raw]
        out = np.zeros(out_shape, dtype=kernel.out_dtype)
        err = np.zeros(1, dtype=np.int32)
        args = [ctypes.c_longlong(out.size)]
        args += [ctypes.c_void_p(a.ctypes.data) for a in full + raws]
        args += [ctypes.c_void_p(out.ctypes.data), ctypes.c_void_p(err.ctypes.data)]
        getattr(lib, kernel.name)(*args)
        return out, int(err[0])


@pytest.fixture
def host_cxx(tmp_path: Path) -> HostCompiler:
    if CXX is None:
        pytest.skip("no host C++ compiler (g++) to run the generated kernel bodies")
    return HostCompiler(tmp_path)


@pytest.fixture(scope="session")
def gpu_backend():
    """The cuda backend when a GPU works here; skips with the probe's reason otherwise."""
    from rlx_cuda import CudaBackend

    backend = CudaBackend()
    got = backend.probe()
    if not got.available:
        pytest.skip(f"needs a CUDA GPU: {got.reason}")
    return backend
