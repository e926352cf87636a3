"""The row kernels (softmax, attention softmax, layer_norm) compiled to PTX by nvcc, when
a CUDA toolkit is installed: proof that the CUDA C is valid without a GPU. float16
kernels need CuPy's headers (as NVRTC gets them at run time)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from rlx_cuda import nn_source as nn

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) is not installed")
_INCLUDE = "#include <cupy/float16.cuh>\n"


def _sources(dtype: str) -> list[nn.RowSource]:
    return [nn.softmax_source(dtype, m) for m in ("none", "bool", "add")] + [
        nn.layer_norm_source(dtype, b) for b in (True, False)
    ]


def _compile(tmp_path: Path, sources: list[nn.RowSource], extra: list[str], head: str = "") -> str:
    bodies = [s.code.replace(_INCLUDE, "") for s in sources]
    unit = head + "".join(f"namespace rlx_ns{i} {{\n{code}\n}}\n" for i, code in enumerate(bodies))
    cu, ptx = tmp_path / "rows.cu", tmp_path / "rows.ptx"
    cu.write_text(unit)
    done = subprocess.run([NVCC, "-ptx", "-arch=sm_80", *extra, "-o", str(ptx), str(cu)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    return ptx.read_text()


def test_float32_and_float64_row_kernels_compile(tmp_path):
    sources = _sources("float32") + _sources("float64")
    ptx = _compile(tmp_path, sources, [])
    for s in sources:
        assert f".entry {s.name}(" in ptx


def test_float16_row_kernels_compile_with_cupy_headers(tmp_path):
    cupy = pytest.importorskip("cupy", reason="CuPy (and its headers) is not installed")
    include = Path(cupy.__file__).parent / "_core" / "include"
    cccl = include / "cupy" / "_cccl"
    if not (include / "cupy" / "float16.cuh").exists():
        pytest.skip("this CuPy has no cupy/float16.cuh")
    flags = [f"-I{include}", f"-I{cccl / 'libcudacxx' / 'include'}", f"-I{cccl / 'thrust'}", f"-I{cccl / 'cub'}"]
    sources = _sources("float16")
    ptx = _compile(tmp_path, sources, flags, head=_INCLUDE)
    for s in sources:
        assert f".entry {s.name}(" in ptx
