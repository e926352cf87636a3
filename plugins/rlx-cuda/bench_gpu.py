"""GPU benchmarks of rlx-cuda, for a session with an NVIDIA GPU (H100/H200).

Three measurements, each against the yardstick of issue 8:

1. float32 matmul 4096^3: rlx ``cuda`` (``run_dlpack``, data on the device) vs
   ``cupy.matmul`` (target: rlx >= 0.9x cupy's rate);
2. every model of the bench suite (``bench/models.py``, loaded from its ONNX) on rlx
   ``cuda`` vs torch eager CUDA running the same graph op by op (target: rlx <= 1.2x
   torch's time), when torch is installed;
3. the suite's elementwise model vs a device-to-device copy of the same bytes (target:
   >= 60%), at the suite's size and at 8192x8192.

Run from the repository root: ``python plugins/rlx-cuda/bench_gpu.py [--quick] [--json OUT]``.
Without a working GPU it prints the probe's reason and exits 0 (nothing to measure).
Timings are medians of CUDA-synchronized wall-clock runs after warm-up.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import rlx_core
from rlx_core.ir.ops import OpKind

ROOT = Path(__file__).resolve().parents[2]


def _median_seconds(fn: Callable[[], Any], sync: Callable[[], None], runs: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_matmul(cp: Any, n: int, runs: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    g = rlx_core.Graph(f"matmul{n}")
    x = g.input("x", (n, n))
    g.set_outputs([g.matmul(x, g.param("w", rng.standard_normal((n, n), dtype=np.float32)))])
    cg = rlx_core.compile(g, device="cuda")
    a = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    b = cp.asarray(g.value(g.params[0]))
    sync = cp.cuda.Device().synchronize
    t_rlx = _median_seconds(lambda: cg._exe.run_dlpack({"x": a}), sync, runs)
    t_cupy = _median_seconds(lambda: cp.matmul(a, b), sync, runs)
    flops = 2.0 * n**3
    return {"n": n, "rlx_tflops": flops / t_rlx / 1e12, "cupy_tflops": flops / t_cupy / 1e12,
            "ratio": t_cupy / t_rlx, "target": ">= 0.9", "met": t_cupy / t_rlx >= 0.9}


# ----------------------------------------------------------------------------- torch eager
def _torch_runner(torch: Any, graph: rlx_core.Graph) -> Callable[[dict[str, Any]], Any]:
    """The graph op by op in torch eager mode on CUDA (what a PyTorch user's model does)."""
    F = torch.nn.functional
    dev = torch.device("cuda")
    nodes = graph.nodes
    consts = {i: torch.as_tensor(np.asarray(graph.value(i))).to(dev) for i in (*graph.params,)}
    consts.update({n.id: torch.as_tensor(np.asarray(graph.value(n.id))).to(dev) for n in nodes
                   if n.op is OpKind.CONSTANT})
    dtypes = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "int32": torch.int32,
              "int64": torch.int64, "bool": torch.bool}

    def run(feed: dict[str, Any]) -> Any:
        v: dict[int, Any] = dict(consts)
        for n in nodes:
            a, x = n.attrs, [v[i] for i in n.inputs]
            op = n.op
            if op is OpKind.INPUT:
                v[n.id] = feed[n.name]
            elif op in (OpKind.PARAM, OpKind.CONSTANT):
                continue
            elif op is OpKind.MATMUL:
                v[n.id] = torch.matmul(x[0], x[1])
            elif op in _BINARY:
                v[n.id] = getattr(torch, _BINARY[op])(x[0], x[1])
            elif op in _UNARY:
                v[n.id] = getattr(torch, _UNARY[op])(x[0])
            elif op is OpKind.RELU:
                v[n.id] = torch.relu(x[0])
            elif op is OpKind.GELU:
                v[n.id] = F.gelu(x[0], approximate=a["approximate"])
            elif op is OpKind.SOFTMAX:
                v[n.id] = torch.softmax(x[0], dim=a["axis"])
            elif op is OpKind.LAYER_NORM:
                shape = n.shape[a["axis"]:]
                v[n.id] = F.layer_norm(x[0], shape, x[1].expand(shape), x[2].expand(shape) if len(x) == 3 else None,
                                       a["eps"])
            elif op in (OpKind.REDUCE_SUM, OpKind.REDUCE_MEAN, OpKind.REDUCE_MAX):
                fn = {OpKind.REDUCE_SUM: torch.sum, OpKind.REDUCE_MEAN: torch.mean, OpKind.REDUCE_MAX: torch.amax}[op]
                v[n.id] = fn(x[0], dim=a["axes"], keepdim=a["keepdims"])
            elif op is OpKind.RESHAPE:
                v[n.id] = x[0].reshape(n.shape)
            elif op is OpKind.TRANSPOSE:
                v[n.id] = x[0].permute(a["perm"])
            elif op is OpKind.CONCAT:
                v[n.id] = torch.cat(x, dim=a["axis"])
            elif op is OpKind.CAST:
                v[n.id] = x[0].to(dtypes[a["dtype"]])
            elif op is OpKind.WHERE:
                v[n.id] = torch.where(x[0], x[1], x[2])
            elif op is OpKind.GATHER:
                v[n.id] = torch.index_select(x[0], a["axis"], x[1].reshape(-1)).reshape(n.shape)
            elif op is OpKind.CONV2D:
                t, l_, b_, r_ = a["padding"]
                xp = F.pad(x[0], (l_, r_, t, b_))
                v[n.id] = F.conv2d(xp, x[1], x[2] if len(x) == 3 else None, a["stride"], 0, a["dilation"], a["groups"])
            elif op is OpKind.MAX_POOL2D and a["padding"][:2] == a["padding"][2:]:
                v[n.id] = F.max_pool2d(x[0], a["kernel"], a["stride"], a["padding"][:2], a["dilation"], a["ceil_mode"])
            elif op is OpKind.AVG_POOL2D and a["padding"][:2] == a["padding"][2:]:
                v[n.id] = F.avg_pool2d(x[0], a["kernel"], a["stride"], a["padding"][:2], a["ceil_mode"],
                                       a["count_include_pad"])
            elif op is OpKind.GLOBAL_AVG_POOL2D:
                v[n.id] = x[0].mean(dim=(2, 3), keepdim=True)
            elif op is OpKind.ATTENTION:
                mask = x[3] if len(x) == 4 else None
                v[n.id] = F.scaled_dot_product_attention(x[0], x[1], x[2], attn_mask=mask, scale=a["scale"])
            else:
                raise NotImplementedError(f"torch runner: no mapping for {op}")
        return [v[i] for i in graph.outputs]

    return run


_BINARY = {OpKind.ADD: "add", OpKind.SUB: "sub", OpKind.MUL: "mul", OpKind.DIV: "div", OpKind.POW: "pow",
           OpKind.MAXIMUM: "maximum", OpKind.MINIMUM: "minimum", OpKind.EQUAL: "eq", OpKind.LESS: "lt",
           OpKind.GREATER: "gt"}
_UNARY = {OpKind.NEG: "neg", OpKind.ABS: "abs", OpKind.EXP: "exp", OpKind.LOG: "log", OpKind.SQRT: "sqrt",
          OpKind.RSQRT: "rsqrt", OpKind.ERF: "erf", OpKind.TANH: "tanh", OpKind.SIGMOID: "sigmoid"}


def bench_suite(cp: Any, size: str, runs: int) -> list[dict[str, Any]]:
    sys.path.insert(0, str(ROOT))
    from bench import models  # the repository's suite (not an installed package)
    from rlx_core.onnx import load as load_onnx

    try:
        import torch
    except ImportError:
        torch = None
    rows = []
    sync = cp.cuda.Device().synchronize
    for name in models.MODEL_NAMES:
        m = models.build(name, size)
        graph = load_onnx(m.onnx)
        cg = rlx_core.compile(graph, device="cuda")
        dev_inputs = {k: cp.asarray(v) for k, v in m.inputs.items()}
        t_rlx = _median_seconds(lambda cg=cg, d=dev_inputs: cg._exe.run_dlpack(d), sync, runs)
        t_host = _median_seconds(lambda cg=cg, m=m: cg.run(m.inputs), sync, runs)
        got = cg.run(m.inputs)[0]
        err = float(np.max(np.abs(got - m.reference64())))
        row = {"model": name, "rlx_ms": t_rlx * 1e3, "rlx_host_io_ms": t_host * 1e3, "max_abs_err": err,
               "report_notes": cg.report().notes}
        if torch is not None and torch.cuda.is_available():
            run = _torch_runner(torch, graph)
            feed = {k: torch.as_tensor(v).cuda() for k, v in m.inputs.items()}
            with torch.inference_mode():
                t_torch = _median_seconds(lambda run=run, feed=feed: run(feed), torch.cuda.synchronize, runs)
            row.update({"torch_eager_ms": t_torch * 1e3, "ratio": t_rlx / t_torch, "target": "<= 1.2",
                        "met": t_rlx / t_torch <= 1.2})
        else:
            row["torch_eager_ms"] = None
        rows.append(row)
    return rows


def bench_bandwidth(cp: Any, runs: int, quick: bool) -> list[dict[str, Any]]:
    """The suite's elementwise model (15 ops, read x once, write y once) against a
    device-to-device copy of the same bytes, end to end through ``run_dlpack``, at the
    suite's size (launch-bound: 8 MiB move in microseconds) and at a size where
    bandwidth, not launch overhead, decides."""
    sys.path.insert(0, str(ROOT))
    from bench import models
    from rlx_core.onnx import load as load_onnx

    sync = cp.cuda.Device().synchronize
    out = []
    for rows, cols in ((1024, 1024), (2048, 2048) if quick else (8192, 8192)):
        m = models._elementwise(f"{rows}x{cols}", rows=rows, cols=cols)
        cg = rlx_core.compile(load_onnx(m.onnx), device="cuda")
        x = cp.asarray(m.inputs["x"])
        t_rlx = _median_seconds(lambda cg=cg, x=x: cg._exe.run_dlpack({"x": x}), sync, runs)
        dst = cp.empty_like(x)
        t_copy = _median_seconds(lambda x=x, dst=dst: cp.copyto(dst, x), sync, runs)
        fraction = t_copy / t_rlx  # same bytes read and written
        out.append({"shape": f"{rows}x{cols}", "rlx_ms": t_rlx * 1e3, "copy_ms": t_copy * 1e3,
                    "rlx_gbps": 2 * x.nbytes / t_rlx / 1e9, "copy_gbps": 2 * x.nbytes / t_copy / 1e9,
                    "fraction": fraction, "target": ">= 0.6", "met": fraction >= 0.6,
                    "notes": cg.report().notes})
        del x, dst, cg
    out.append(_arithmetic_chain(cp, runs, 2048 if quick else 8192))
    return out


def _arithmetic_chain(cp: Any, runs: int, n: int) -> dict[str, Any]:
    """15 multiply/add ops on an n x n float32 input, fused into one kernel: the same
    bytes as the elementwise model without its transcendental math (tanh, exp, log,
    sqrt, two divisions), which makes that one compute-bound at large sizes."""
    rng = np.random.default_rng(0)
    g = rlx_core.Graph("arith15")
    x = g.input("x", (n, n))
    y = x
    for i in range(15):
        c = g.constant(np.float32(rng.uniform(0.5, 1.5)))
        y = g.mul(y, c) if i % 2 else g.add(y, c)
    g.set_outputs([y])
    cg = rlx_core.compile(g, device="cuda")
    xa = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    sync = cp.cuda.Device().synchronize
    t_rlx = _median_seconds(lambda: cg._exe.run_dlpack({"x": xa}), sync, runs)
    dst = cp.empty_like(xa)
    t_copy = _median_seconds(lambda: cp.copyto(dst, xa), sync, runs)
    return {"shape": f"{n}x{n} (15 add/mul, no transcendentals)", "rlx_ms": t_rlx * 1e3, "copy_ms": t_copy * 1e3,
            "rlx_gbps": 2 * xa.nbytes / t_rlx / 1e9, "copy_gbps": 2 * xa.nbytes / t_copy / 1e9,
            "fraction": t_copy / t_rlx, "target": "(reference)", "met": True, "notes": cg.report().notes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few runs (checks that it all runs)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    backend = rlx_core.get_backend("cuda")
    got = backend.probe()
    if not got.available:
        print(f"rlx-cuda bench: nothing to measure, cuda is unavailable here: {got.reason}")
        return 0
    import cupy as cp

    runs = 5 if args.quick else 30
    n = 1024 if args.quick else 4096
    results = {"device": got.versions.get("device", "?"), "versions": got.versions, "matmul": bench_matmul(cp, n, runs),
               "suite": bench_suite(cp, "quick" if args.quick else "full", runs),
               "bandwidth": bench_bandwidth(cp, runs, args.quick)}
    print(json.dumps(results, indent=2, default=str))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    misses = [r["model"] for r in results["suite"] if r.get("met") is False]
    misses += [f"bandwidth@{b['shape']}" for b in results["bandwidth"] if not b["met"]]
    if misses or not results["matmul"]["met"]:
        print(f"targets missed: {'matmul ' if not results['matmul']['met'] else ''}{' '.join(misses)}")
    return 0 if math.isfinite(results["matmul"]["ratio"]) else 1


if __name__ == "__main__":
    sys.exit(main())
