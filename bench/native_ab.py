"""Two builds of rlx-cpu's native library, kernel against kernel, in one process.

    python bench/native_ab.py OLD.so NEW.so [--kernel conv_nhwc|depthwise_rows|dense] [--shapes ...] [--rounds 15]

Why: on a shared 2-core VM whole-model times of two checkouts swing by 1.5x from one
process to the next (a co-tenant fills L3, the host's slow state), far more than most
kernel changes move them. Here both libraries are loaded side by side (``ctypes``), each
kernel call of each contender is made with the same arrays, the contenders take turns
round by round (5 ms apart), and each figure is the best round: what the kernel costs
when the host lets it run. Outputs are checked against numpy's first, for every build.

Builds to compare: ``_rlx_native.so`` of two checkouts (``git worktree add /tmp/old REV``,
then ``python plugins/rlx-cpu/rlx_cpu/_build.py`` there), or single-target builds of one
``native.c`` each (``gcc -O3 -march=x86-64-v4 -fopenmp -DRLX_NO_CLONES -shared -fPIC``
with ``_build.py``'s flags, ``rlx_gemm_avx512`` returning 1), which take 35 s, not 3-4
minutes.

Kernels:

- ``conv_nhwc``: ``rlx_conv_nhwc``, 1x1, NHWC in and out, at one and two threads, and the
  NCHW product ``rlx_gemm`` of the first build beside it; shapes ``C,O,HW``.
- ``depthwise_rows``: ``rlx_depthwise_conv`` (the row kernel, 3x3; stride 2 over split
  rows) without an epilogue and with a ReLU's clamp, at two threads; shapes ``N,C,HW,K,S``.
- ``dense``: ``rlx_gemm`` as a dense layer runs it (A, the activations, read in place; B,
  the weights, packed once by ``rlx_gemm_pack_b``; a bias per row), at one and two
  threads; shapes ``M,K,N`` (a transformer's 1024 tokens through its 768 -> 3072 layer:
  ``1024,768,3072``).
"""

from __future__ import annotations

import argparse
import ctypes
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

_I64, _P = ctypes.c_int64, ctypes.c_void_p
_CONV_SHAPES = "48,24,56;24,72,56;72,24,56;40,120,28;120,40,28;112,672,14;672,112,14;32,16,112;64,64,56"
_DW_SHAPES = "4,64,112,3,2;1,72,56,3,1;1,144,56,3,1;8,144,56,3,1;1,32,112,3,1;1,48,112,3,2"
_DENSE_SHAPES = "1024,768,3072;1024,3072,768;1024,768,768;128,768,3072;128,3072,768;1576,768,3072;4096,3072,768"
_RLX_PK_DEPTHWISE = 8  # native.c's RLX_PK_DEPTHWISE, rlx_packed's kernel number


def _load(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(Path(path).resolve()))
    lib.rlx_abi.restype = _I64
    lib.images_arg = lib.rlx_abi() >= 33  # ABI 33 added a count of images before the threads
    lib.rlx_conv_nhwc.argtypes = [_P, _P, _P, _P, _P, *[_I64] * (17 if lib.images_arg else 16), _P]
    lib.rlx_conv_nhwc.restype = None
    lib.rlx_conv_nhwc_pack.argtypes = [_P, _I64, _I64, _I64, _I64, _P]
    lib.rlx_conv_nhwc_pack_size.argtypes = [_I64] * 4
    lib.rlx_conv_nhwc_pack_size.restype = _I64
    lib.rlx_conv_nhwc_scratch.argtypes = [_I64] * 7
    lib.rlx_conv_nhwc_scratch.restype = _I64
    lib.rlx_gemm.argtypes = [_I64, _I64, _I64, _P, _I64, _I64, _I64, _P, _I64, _I64, _I64, _P, _I64, _I64, _I64, _I64,
                             _I64, _P, _P]
    lib.rlx_gemm_pack_b.argtypes = [_P, _I64, _I64, _I64, _I64, _P]
    lib.rlx_gemm_pack_b_size.argtypes = [_I64, _I64]
    lib.rlx_gemm_pack_b_size.restype = _I64
    lib.rlx_packed.argtypes = [_P]
    lib.rlx_packed.restype = _I64
    lib.rlx_bind_team.argtypes = [_I64]
    lib.rlx_bind_team.restype = _I64
    lib.rlx_bind_team(2)  # the workers pinned as rlx-cpu pins them
    return lib


def _best(contenders: dict[str, Callable[[], object]], rounds: int, calls: int = 5) -> dict[str, float]:
    """Microseconds a call, the best of ``rounds`` rounds in which the contenders take turns."""
    best = dict.fromkeys(contenders, float("inf"))
    for _ in range(rounds):
        for name, fn in contenders.items():
            time.sleep(0.005)
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) / calls * 1e6)
    return best


def _conv_nhwc(libs: dict[str, ctypes.CDLL], shape: tuple[int, ...], rounds: int) -> dict[str, float]:
    c, o, hw = shape
    rng = np.random.default_rng(0)
    x = rng.standard_normal((hw, hw, c)).astype(np.float32)
    xn = np.ascontiguousarray(x.transpose(2, 0, 1))
    w = rng.standard_normal((o, c, 1, 1)).astype(np.float32)
    bias = rng.standard_normal(o).astype(np.float32)
    want = x.reshape(-1, c).astype(np.float64) @ w.reshape(o, c).T.astype(np.float64) + bias
    keep, contenders = [], {}
    for name, lib in libs.items():
        wpk = np.zeros(lib.rlx_conv_nhwc_pack_size(o, c, 1, 1), np.float32)
        lib.rlx_conv_nhwc_pack(w.ctypes.data, o, c, 1, 1, wpk.ctypes.data)
        scratch = np.zeros(lib.rlx_conv_nhwc_scratch(c, hw, hw, o, hw, hw, 0), np.float32)
        for threads in (1, 2):
            y = np.full((hw, hw, o), np.nan, np.float32)
            keep += [wpk, scratch, y]

            def run(lib: ctypes.CDLL = lib, wpk: np.ndarray = wpk, scratch: np.ndarray = scratch,
                    y: np.ndarray = y, threads: int = threads) -> None:
                images = (1,) if lib.images_arg else ()
                lib.rlx_conv_nhwc(x.ctypes.data, wpk.ctypes.data, bias.ctypes.data, y.ctypes.data,
                                  scratch.ctypes.data, c, hw, hw, o, 1, 1, 1, 1, 1, 1, 0, 0, hw, hw, 0, *images,
                                  threads, None)

            run()
            np.testing.assert_allclose(y.reshape(-1, o), want, rtol=1e-3, atol=1e-3)
            contenders[f"{name} {threads}t"] = run
    lib = next(iter(libs.values()))
    wm = np.ascontiguousarray(w.reshape(o, c))
    yn = np.full((o, hw * hw), np.nan, np.float32)

    def gemm() -> None:
        lib.rlx_gemm(o, hw * hw, c, wm.ctypes.data, c, 1, 0, xn.ctypes.data, hw * hw, 1, 0, yn.ctypes.data, hw * hw, 0,
                     1, 0, 2, bias.ctypes.data, None)

    gemm()
    np.testing.assert_allclose(yn.T, want, rtol=1e-3, atol=1e-3)
    contenders["NCHW rlx_gemm 2t"] = gemm
    return _best(contenders, rounds)


def _depthwise_rows(libs: dict[str, ctypes.CDLL], shape: tuple[int, ...], rounds: int) -> dict[str, float]:
    n, c, hw, k, s = shape
    p, threads = k // 2, 2
    oh = (hw + 2 * p - k) // s + 1
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    w = rng.standard_normal((c, 1, k, k)).astype(np.float32)
    b = np.zeros(c, np.float32)
    hp = (oh - 1) * s + k
    scratch = np.zeros(threads * hp * hp, np.float32)
    # an rlx_epilogue that is a clamp to [0, inf) (a ReLU): meta, ptrs, vml, work, per_thread, clamp, bounds
    relu = np.array([0, 0, 0, 0, 0, 1, int(np.array([0.0, np.inf], np.float32).view(np.uint64)[0])], np.uint64)
    keep, outs, contenders = [], {}, {}
    for name, lib in libs.items():
        for clamp in (False, True):
            y = np.zeros((n, c, oh, oh), np.float32)
            args = np.array([_RLX_PK_DEPTHWISE, x.ctypes.data, w.ctypes.data, b.ctypes.data, y.ctypes.data,
                             scratch.ctypes.data, n * c, c, hw, hw, k, k, s, s, 1, 1, p, p, oh, oh, threads,
                             relu.ctypes.data if clamp else 0], np.int64)
            keep += [y, args]

            def run(lib: ctypes.CDLL = lib, args: np.ndarray = args) -> None:
                if lib.rlx_packed(args.ctypes.data) != 0:
                    raise RuntimeError("rlx_packed does not know the depthwise kernel's number in this build")

            run()
            outs[(name, clamp)] = y
            contenders[f"{name} {'relu' if clamp else 'none'}"] = run
    first = next(iter(libs))
    for name in libs:
        np.testing.assert_array_equal(outs[(name, True)], np.maximum(outs[(first, False)], 0))
    return _best(contenders, rounds)


def _dense(libs: dict[str, ctypes.CDLL], shape: tuple[int, ...], rounds: int) -> dict[str, float]:
    m, k, n = shape
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64) + bias[:, None]
    keep, contenders = [], {}
    for name, lib in libs.items():
        packed = np.zeros(lib.rlx_gemm_pack_b_size(n, k), np.float32)
        lib.rlx_gemm_pack_b(b.ctypes.data, n, 1, k, n, packed.ctypes.data)
        for threads in (1, 2):
            c = np.full((m, n), np.nan, np.float32)
            keep += [packed, c]

            def run(lib: ctypes.CDLL = lib, packed: np.ndarray = packed, c: np.ndarray = c,
                    threads: int = threads) -> None:
                lib.rlx_gemm(m, n, k, a.ctypes.data, k, 1, 0, packed.ctypes.data, 0, 0, 0, c.ctypes.data, n, 0, 1,
                             2, threads, bias.ctypes.data, None)  # flags 2: B packed

            run()
            np.testing.assert_allclose(c, want, rtol=1e-3, atol=1e-3 * np.sqrt(k))
            contenders[f"{name} {threads}t"] = run
    return _best(contenders, rounds, calls=3)


_KERNELS = {"conv_nhwc": (_conv_nhwc, _CONV_SHAPES), "depthwise_rows": (_depthwise_rows, _DW_SHAPES),
            "dense": (_dense, _DENSE_SHAPES)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("libs", nargs=2, help="two builds of _rlx_native.so: old, new")
    ap.add_argument("--kernel", choices=sorted(_KERNELS), default="conv_nhwc")
    ap.add_argument("--shapes", help="';'-separated shapes (conv_nhwc: C,O,HW; depthwise_rows: N,C,HW,K,S; "
                                     "dense: M,K,N)")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    libs = {}
    for i, path in enumerate(args.libs):
        libs[f"{'old' if i == 0 else 'new'}"] = _load(path)
    bench, default_shapes = _KERNELS[args.kernel]
    spec = args.shapes or default_shapes
    for text in spec.split(";"):
        shape = tuple(int(v) for v in text.split(","))
        best = bench(libs, shape, args.rounds)
        print(f"{text:>16}: " + "  ".join(f"{k} {v:7.1f}" for k, v in best.items()) + "  (us)", flush=True)


if __name__ == "__main__":
    main()
