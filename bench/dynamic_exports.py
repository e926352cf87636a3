"""Dynamic-axes exports of real architectures, loaded without dims, against ONNX Runtime.

Eight small models are built from code with random weights (nothing is downloaded):
torchvision's resnet18 (64x64, BatchNorm statistics randomized so that eval-mode BatchNorm
matters) and a small VisionTransformer (its zero-initialized head and class token
re-initialized, else its output is constant), transformers' BERT, GPT-2, LLaMA (GQA, RoPE)
and wav2vec2 with tiny configs, an LSTM language model and a small 3-D CNN. Each is exported,
in memory, by torch's classic exporter (``dynamo=False``, opset 17, ``dynamic_axes``) and the
dynamo exporter (``dynamic_shapes``) with a symbolic batch and, but for the image models, a
symbolic length (tokens, audio samples, video frames). rlx loads each without ``dims``
(``rlx_core.onnx.load(bytes)``), compiles it once per device and runs it at batch 1, 3, 8, 17
and three lengths (tokens 7, 64, 200; samples 800, 1600, 3200; frames 4, 8, 16). Every output
is compared with ONNX Runtime's on the same inputs: same shape and dtype, max|rlx - ORT| /
max|ORT| at most 1e-3. Attention masks have the last row's last third padded, so that masking
matters. A case that raises is a failure (its exception's first line).

torch, torchvision and transformers are bench extras, never runtime dependencies:

    python bench/dynamic_exports.py                          # every model, both exporters, cpu and jax
    python bench/dynamic_exports.py --quick --devices cpu    # batch 1 and 3, two lengths
    python bench/dynamic_exports.py --models bert,lstm --exporters dynamo --json out.json

One line per (model, exporter, device): cases passed / run, the worst relative error; exit
code 1 if any case failed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

__all__ = ["MODELS", "Spec", "build", "export", "inputs", "main"]

VOCAB = 1000
TOLERANCE = 1e-3
BATCHES = (1, 3, 8, 17)
EXPORTERS = ("classic", "dynamo")


@dataclass(frozen=True)
class Spec:
    """Inputs (name, kind, shape: "B" batch, "L" length), the length's meaning, the one output,
    the length exported at and those checked."""

    inputs: tuple[tuple[str, str, tuple[int | str, ...]], ...]
    length: str | None
    output: str
    export_length: int | None = None
    lengths: tuple[int | None, ...] = (None,)


_TEXT = (("input_ids", "tokens", ("B", "L")), ("attention_mask", "mask", ("B", "L")))
_SEQ = {"length": "seq", "output": "last_hidden_state", "export_length": 16, "lengths": (7, 64, 200)}
MODELS: dict[str, Spec] = {
    "resnet": Spec((("x", "float", ("B", 3, 64, 64)),), None, "logits"),
    "vit": Spec((("x", "float", ("B", 3, 32, 32)),), None, "logits"),
    "bert": Spec(_TEXT, **_SEQ),
    "gpt2": Spec(_TEXT, **_SEQ),
    "llama": Spec(_TEXT, **_SEQ),
    "lstm": Spec((("tokens", "tokens", ("B", "L")),), **{**_SEQ, "output": "logits"}),
    "wav2vec2": Spec((("input_values", "float", ("B", "L")),), "samples", "last_hidden_state", 1600,
                     (800, 1600, 3200)),
    "cnn3d": Spec((("x", "float", ("B", 3, "L", 32, 32)),), "frames", "logits", 8, (4, 8, 16)),
}


def inputs(name: str, batch: int, length: int | None, seed: int) -> dict[str, np.ndarray]:
    """``name``'s inputs at ``batch`` and ``length``: seeded tokens and standard normal floats;
    masks all ones but the last row's last third (lengths above 2)."""
    rng = np.random.default_rng(seed)
    out = {}
    for key, kind, template in MODELS[name].inputs:
        shape = tuple(batch if d == "B" else length if d == "L" else d for d in template)
        if kind == "tokens":
            out[key] = rng.integers(0, VOCAB, shape, dtype=np.int64)
        elif kind == "mask":
            out[key] = np.ones(shape, dtype=np.int64)
            if length is not None and length > 2:
                out[key][-1, length - length // 3 :] = 0
        else:
            out[key] = rng.standard_normal(shape, dtype=np.float32)
    return out


def build(name: str) -> Any:
    """``name`` built with random weights (``torch.manual_seed(0)``), in eval mode, taking its
    inputs positionally and giving one tensor."""
    import torch
    from torch import nn

    class Text(nn.Module):  # a transformers text model: last_hidden_state only
        def __init__(self, m: Any) -> None:
            super().__init__()
            self.m = m

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    class Audio(Text):
        def forward(self, input_values: Any) -> Any:
            return self.m(input_values=input_values).last_hidden_state

    class LSTMLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.lstm = nn.Embedding(VOCAB, 32), nn.LSTM(32, 64, num_layers=2, batch_first=True)
            self.out = nn.Linear(64, VOCAB)

        def forward(self, tokens: Any) -> Any:
            return self.out(self.lstm(self.emb(tokens))[0])

    torch.manual_seed(0)
    if name == "resnet":
        import torchvision

        m = _randomize_bn(torchvision.models.resnet18(weights=None))
    elif name == "vit":
        from torchvision.models import VisionTransformer

        m = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=64, mlp_dim=128,
                              num_classes=10)
        with torch.no_grad():  # torchvision zero-initializes them: the output would be constant
            m.heads.head.weight.normal_(0, 0.1)
            m.heads.head.bias.normal_(0, 0.1)
            m.class_token.normal_(0, 0.02)
    elif name in ("bert", "gpt2", "llama", "wav2vec2"):
        import transformers as tf

        tf.logging.set_verbosity_error()  # gpt2's default bos/eos ids lie outside the tiny vocabulary
        m = {"bert": lambda: Text(tf.BertModel(tf.BertConfig(
                 hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                 vocab_size=VOCAB, max_position_embeddings=256))),
             "gpt2": lambda: Text(tf.GPT2Model(tf.GPT2Config(
                 n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=256, use_cache=False))),
             "llama": lambda: Text(tf.LlamaModel(tf.LlamaConfig(
                 hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256, use_cache=False))),
             "wav2vec2": lambda: Audio(tf.Wav2Vec2Model(tf.Wav2Vec2Config(
                 hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_feat_extract_layers=2,
                 feat_extract_norm="group")))}[name]()
    elif name == "lstm":
        m = LSTMLM()
    elif name == "cnn3d":
        m = _randomize_bn(nn.Sequential(
            nn.Conv3d(3, 8, 3, padding=1), nn.BatchNorm3d(8), nn.ReLU(), nn.MaxPool3d(2),
            nn.Conv3d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(16, 10)))
    else:
        raise KeyError(name)
    return m.eval()


def _randomize_bn(model: Any) -> Any:
    """Non-trivial BatchNorm running statistics, so that eval-mode BatchNorm is exercised."""
    import torch

    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
                mod.running_mean.copy_(torch.randn(mod.running_mean.shape, generator=gen) * 0.1)
                mod.running_var.copy_(torch.rand(mod.running_var.shape, generator=gen) * 0.5 + 0.75)
    return model


def export(name: str, exporter: str) -> bytes:
    """The ONNX bytes of ``name`` from ``exporter`` ("classic" or "dynamo"), exported at
    batch 2 (and the spec's export length) with the batch and length axes dynamic."""
    import torch

    spec = MODELS[name]
    example = inputs(name, 2, spec.export_length, seed=0)
    args = tuple(torch.from_numpy(v) for v in example.values())
    names = list(example)
    module = build(name)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if exporter == "classic":
            axes: dict[str, dict[int, str]] = {
                key: {ax: "batch" if d == "B" else str(spec.length) for ax, d in enumerate(shape) if d in ("B", "L")}
                for key, _, shape in spec.inputs}
            axes[spec.output] = {0: "batch"}
            if spec.length == "seq":
                axes[spec.output][1] = "seq"
            elif name == "wav2vec2":
                axes[spec.output][1] = "frames_out"
            buf = io.BytesIO()
            torch.onnx.export(module, args, buf, dynamo=False, opset_version=17, input_names=names,
                              output_names=[spec.output], dynamic_axes=axes, do_constant_folding=True)
            return buf.getvalue()
        from torch.export import Dim

        batch = Dim("batch", min=1, max=1024)
        # the smallest length each model takes: wav2vec2's convolutions need 400 samples,
        # MaxPool3d(2) 2 frames. lstm: the dynamo path declares the output's length as the
        # example's (16), with any min; the graph itself stays length-generic.
        length = {"seq": Dim("seq", min=1, max=256), "samples": Dim("samples", min=400, max=160000),
                  "frames": Dim("frames", min=2, max=1024)}.get(spec.length or "")
        shapes = tuple({ax: batch if d == "B" else length for ax, d in enumerate(shape) if d in ("B", "L")}
                       for _, _, shape in spec.inputs)
        program = torch.onnx.export(module, args, dynamo=True, input_names=names, output_names=[spec.output],
                                    dynamic_shapes=shapes, optimize=True)
        return program.model_proto.SerializeToString()


def _first_line(exc: BaseException) -> str:
    lines = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:300]


def _compare(got: list[np.ndarray], want: list[np.ndarray]) -> tuple[list[float], str | None]:
    """Each output's relative error (max|got - want| / max|want|) and the first mismatch."""
    if len(got) != len(want):
        return [], f"{len(got)} outputs, ORT {len(want)}"
    rels = []
    for k, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        if g.shape != w.shape or g.dtype != w.dtype:
            return rels, f"output {k}: {g.dtype}{list(g.shape)}, ORT {w.dtype}{list(w.shape)}"
        if not g.size:
            rels.append(0.0)
            continue
        diff = float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64))))
        rels.append(diff / max(float(np.max(np.abs(w.astype(np.float64)))), 1e-30))
    bad = [r for r in rels if not r <= TOLERANCE]  # NaN fails too
    return rels, f"relative error {bad[0]:.3g} > {TOLERANCE:g}" if bad else None


def check(name: str, exporter: str, devices: list[str], quick: bool) -> list[dict[str, Any]]:
    """Export ``name`` with ``exporter``, load it without dims, run it on each device at every
    (batch, length) and compare with ORT: one row per case (or per device when before them
    the export, load or compile raised)."""
    import onnxruntime as ort

    import rlx_core
    from rlx_core.onnx import load

    spec = MODELS[name]
    batches, lengths = (BATCHES[:2], spec.lengths[:2]) if quick else (BATCHES, spec.lengths)
    base = {"model": name, "exporter": exporter}
    t0, stage = time.perf_counter(), "export"
    try:
        data = export(name, exporter)
        base["export_s"] = round(time.perf_counter() - t0, 2)
        options, stage = ort.SessionOptions(), "ort"
        options.log_severity_level = 3  # lstm dynamo: ORT warns about the output's declared length
        sess = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        stage, graph = "load", load(data)
    except Exception as exc:
        return [{**base, "device": d, "ok": False, "error": f"{stage}: {_first_line(exc)}"} for d in devices]
    ort_names = {i.name for i in sess.get_inputs()}
    rlx_names = {graph.node(i).name for i in graph.inputs}
    cases = [(b, n, inputs(name, b, n, seed=b * 1000 + (n or 0))) for b in batches for n in lengths]
    wants: list[list[np.ndarray] | str] = []
    for _, _, feed in cases:
        try:
            wants.append(sess.run(None, {k: v for k, v in feed.items() if k in ort_names}))
        except Exception as exc:  # not rlx's failure, but the case cannot pass
            wants.append(f"ort: {_first_line(exc)}")
    rows: list[dict[str, Any]] = []
    for device in devices:
        try:
            compiled = rlx_core.compile(graph, device=device)
        except Exception as exc:
            rows.append({**base, "device": device, "ok": False, "error": f"compile: {_first_line(exc)}"})
            continue
        for (b, n, feed), want in zip(cases, wants):
            row = {**base, "device": device, "batch": b, "length": n}
            try:
                if isinstance(want, str):
                    raise RuntimeError(want)
                t = time.perf_counter()
                got = compiled.run({k: v for k, v in feed.items() if k in rlx_names})
                row["run_s"] = round(time.perf_counter() - t, 4)  # with the compile when the sizes are new
                row["rel"], error = _compare(list(got), want)
            except Exception as exc:
                error = _first_line(exc)
            row["ok"] = error is None
            if error:
                row["error"] = error
            rows.append(row)
    return rows


def _worst(rows: list[dict[str, Any]]) -> str:
    rels = [e if e == e else np.inf for r in rows for e in r.get("rel", [])]  # NaN: worst of all
    return f"{max(rels):.1e}" if rels else "-"


def _names(arg: str, known: tuple[str, ...], what: str, parser: argparse.ArgumentParser) -> list[str]:
    names = [n.strip() for n in arg.split(",") if n.strip()]
    names = [e for n in names for e in (known if n in ("both", "all") else (n,))]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        parser.error(f"unknown {what} {unknown or [arg]}; known: {', '.join(known)}")
    return list(dict.fromkeys(names))


def available(devices: list[str]) -> list[str]:
    """The requested devices registered and probing available; the others skipped, saying so."""
    import rlx_core

    names = set(rlx_core.default_registry().names())
    out = []
    for d in devices:
        ok = d in names and rlx_core.get_backend(d).probe().available
        if not ok:
            print(f"skipping device {d}: {'not available' if d in names else 'no backend registered'}")
        out += [d] * ok
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="all", help=f"comma-separated: {', '.join(MODELS)} (default: all)")
    parser.add_argument("--exporters", default="both", help="classic, dynamo, or both (comma-separated)")
    parser.add_argument("--devices", default="cpu,jax", help="comma-separated rlx devices; unavailable ones skipped")
    parser.add_argument("--quick", action="store_true", help="batch 1 and 3, the first two lengths only")
    parser.add_argument("--json", type=Path, help="write every case here")
    args = parser.parse_args(argv)
    models = _names(args.models, tuple(MODELS), "models", parser)
    exporters = _names(args.exporters, EXPORTERS, "exporters", parser)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("bench/dynamic_exports.py needs torch, torchvision and transformers (bench extras)", file=sys.stderr)
        return 2
    devices = available([d.strip() for d in args.devices.split(",") if d.strip()])
    if not devices:
        print("no requested device is available", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for name in models:
        for exporter in exporters:
            found = check(name, exporter, devices, args.quick)
            rows += found
            for device in devices:
                mine = [r for r in found if r["device"] == device]
                worst = _worst(mine)
                print(f"{name:9} {exporter:8} {device:6} {sum(r['ok'] for r in mine):3}/{len(mine):<3} passed"
                      f"  worst rel err {worst}", flush=True)
                for r in mine:
                    if not r["ok"]:
                        print(f"    FAIL batch {r.get('batch', '-')} length {r.get('length', '-')}: {r['error']}")
    failed = [r for r in rows if not r["ok"]]
    print(f"summary: {len(rows) - len(failed)}/{len(rows)} cases passed, {len(failed)} failed; "
          f"{len(models)} models x {len(exporters)} exporters x devices {','.join(devices)}; worst rel err "
          f"{_worst(rows)} (tolerance {TOLERANCE:g}); {time.perf_counter() - t0:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
