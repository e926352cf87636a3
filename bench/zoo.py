"""Real architectures, exported the way users export them, against ONNX Runtime.

torchvision and transformers models are built from their code with random weights
(nothing is downloaded), exported with torch's classic exporter (``dynamo=False``) and
the dynamo exporter, and each export is loaded by ``rlx_core.onnx.load``, run on every
available rlx device and compared with ONNX Runtime on the same inputs. With ``--time``
rlx (each device and ``auto``) and ORT are timed interleaved (``bench/_timing.py``).

torch, torchvision and transformers are bench extras, never runtime dependencies:

    nox -s zoo                                # installs them, then every model, both exporters, timed
    python bench/zoo.py                       # load + compare, every model, both exporters
    python bench/zoo.py --models resnet18,bert --exporters classic --time

The transformer configs keep their real widths (BERT base: 768 wide, 12 heads, 3072 ff)
with fewer layers, so that every export stays seconds, not minutes; what is being checked
is the graph each layer exports to, which the layer count does not change.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

__all__ = ["ZOO", "ZooModel", "export", "main"]


@dataclass
class ZooModel:
    """A model of the zoo: how to build it and its example inputs (batch given)."""

    name: str
    build: Callable[[], Any]
    inputs: Callable[[int], dict[str, np.ndarray]]
    kind: str = "vision"
    notes: list[str] = field(default_factory=list)
    keywords: bool = False  # called with its inputs by name (transformers' models), else in order


def _image(batch: int, size: int = 224) -> dict[str, np.ndarray]:
    return {"pixel_values": np.random.default_rng(0).standard_normal((batch, 3, size, size), dtype=np.float32)}


def _tokens(batch: int, seq: int, vocab: int = 1000) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    ids = rng.integers(0, vocab, (batch, seq), dtype=np.int64)
    mask = np.ones((batch, seq), dtype=np.int64)
    mask[:, seq - seq // 8 :] = 0  # padded tail: the attention mask matters
    return {"input_ids": ids, "attention_mask": mask}


def _seq2seq(batch: int) -> dict[str, np.ndarray]:
    """An encoder's tokens (sequence 128, padded tail) and the decoder's (64)."""
    decoder = np.random.default_rng(2).integers(0, 1000, (batch, 64), dtype=np.int64)
    return {**_tokens(batch, 128), "decoder_input_ids": decoder}


def _audio(batch: int) -> dict[str, np.ndarray]:
    """One second of 16 kHz samples (wav2vec2's input)."""
    return {"input_values": np.random.default_rng(3).standard_normal((batch, 16000), dtype=np.float32)}


def _mel(batch: int) -> dict[str, np.ndarray]:
    """30 s of 80 mel bins (Whisper's encoder input: 3000 frames)."""
    return {"input_features": np.random.default_rng(4).standard_normal((batch, 80, 3000), dtype=np.float32)}


def _torchvision(name: str, module: str = "", **kwargs: Any) -> Callable[[], Any]:
    def build() -> Any:
        import torchvision

        where = getattr(torchvision.models, module) if module else torchvision.models
        return getattr(where, name)(weights=None, **kwargs)

    return build


def _hf(config_name: str, model_name: str, part: str = "", **config: Any) -> Callable[[], Any]:
    """A transformers model (or its ``part``, e.g. Whisper's ``encoder``) with ``config``."""
    def build() -> Any:
        import transformers

        cfg = getattr(transformers, config_name)(**config)
        model = getattr(transformers, model_name)(cfg)
        if hasattr(model.config, "use_cache"):
            model.config.use_cache = False
        return getattr(model, part) if part else model

    return build


def _segmentation(name: str) -> Callable[[], Any]:
    """A torchvision segmentation model without its auxiliary head (LR-ASPP has none)."""
    extra = {} if name.startswith("lraspp") else {"aux_loss": False}
    return _torchvision(name, "segmentation", weights_backbone=None, **extra)


ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in [
        ZooModel("resnet18", _torchvision("resnet18"), _image),
        ZooModel("mobilenet_v3_small", _torchvision("mobilenet_v3_small"), _image),
        ZooModel("efficientnet_b0", _torchvision("efficientnet_b0"), _image),
        ZooModel("squeezenet", _torchvision("squeezenet1_1"), _image),
        # the families rlx was slowest on when tried untuned (issue 35): grouped and
        # depthwise convolutions, large-kernel depthwise + LayerNorm, dense concatenation
        ZooModel("resnet50", _torchvision("resnet50"), _image),
        ZooModel("resnext50", _torchvision("resnext50_32x4d"), _image),
        ZooModel("mobilenet_v2", _torchvision("mobilenet_v2"), _image),
        ZooModel("convnext_tiny", _torchvision("convnext_tiny"), _image),
        ZooModel("densenet121", _torchvision("densenet121"), _image),
        ZooModel("regnet_y_400mf", _torchvision("regnet_y_400mf"), _image),
        ZooModel("shufflenet_v2", _torchvision("shufflenet_v2_x1_0"), _image),
        ZooModel("bert", _hf("BertConfig", "BertModel", vocab_size=1000, hidden_size=768, num_hidden_layers=2,
                             num_attention_heads=12, intermediate_size=3072), lambda b: _tokens(b, 128), "text"),
        ZooModel("distilbert", _hf("DistilBertConfig", "DistilBertModel", vocab_size=1000, dim=768, n_layers=2,
                                   n_heads=12, hidden_dim=3072), lambda b: _tokens(b, 128), "text"),
        ZooModel("gpt2", _hf("GPT2Config", "GPT2Model", vocab_size=1000, n_embd=768, n_layer=2, n_head=12,
                             n_positions=256), lambda b: _tokens(b, 64), "text"),
        ZooModel("vit", _hf("ViTConfig", "ViTModel", hidden_size=384, num_hidden_layers=2, num_attention_heads=6,
                            intermediate_size=1536, image_size=224, patch_size=16), _image, keywords=True),
        # never tuned on (session 31): segmentation heads (atrous pyramids, bilinear resizes),
        # NAS and hierarchical vision models, encoder-decoders, decoders with rotary
        # embeddings, speech encoders
        ZooModel("deeplabv3_mobilenet", _segmentation("deeplabv3_mobilenet_v3_large"), _image),
        ZooModel("lraspp", _segmentation("lraspp_mobilenet_v3_large"), _image),
        ZooModel("deeplabv3_resnet50", _segmentation("deeplabv3_resnet50"), _image),
        ZooModel("fcn_resnet50", _segmentation("fcn_resnet50"), _image),
        ZooModel("googlenet", _torchvision("googlenet", aux_logits=False, init_weights=True), _image),
        ZooModel("efficientnet_v2_s", _torchvision("efficientnet_v2_s"), _image),
        ZooModel("mnasnet", _torchvision("mnasnet1_0"), _image),
        ZooModel("regnet_x_1_6gf", _torchvision("regnet_x_1_6gf"), _image),
        ZooModel("wide_resnet50", _torchvision("wide_resnet50_2"), _image),
        ZooModel("swin_t", _torchvision("swin_t"), _image),
        ZooModel("segformer", _hf("SegformerConfig", "SegformerModel"), _image, keywords=True),
        ZooModel("clip_vision", _hf("CLIPVisionConfig", "CLIPVisionModel", num_hidden_layers=2, hidden_size=768,
                                    num_attention_heads=12, intermediate_size=3072, image_size=224, patch_size=32),
                 _image, keywords=True),
        ZooModel("roberta", _hf("RobertaConfig", "RobertaModel", vocab_size=1000, num_hidden_layers=2),
                 lambda b: _tokens(b, 128), "text"),
        ZooModel("albert", _hf("AlbertConfig", "AlbertModel", vocab_size=1000, num_hidden_layers=2, hidden_size=768,
                               num_attention_heads=12, intermediate_size=3072, embedding_size=128),
                 lambda b: _tokens(b, 128), "text"),
        ZooModel("opt", _hf("OPTConfig", "OPTModel", vocab_size=1000, num_hidden_layers=2, hidden_size=768,
                            num_attention_heads=12, ffn_dim=3072, word_embed_proj_dim=768),
                 lambda b: _tokens(b, 128), "text"),
        ZooModel("qwen2", _hf("Qwen2Config", "Qwen2Model", vocab_size=1000, num_hidden_layers=2, hidden_size=512,
                              num_attention_heads=8, num_key_value_heads=2, intermediate_size=1408),
                 lambda b: _tokens(b, 128), "text"),
        ZooModel("t5", _hf("T5Config", "T5Model", vocab_size=1000, num_layers=2, num_decoder_layers=2, d_model=512,
                           num_heads=8, d_ff=2048), _seq2seq, "text"),
        ZooModel("bart", _hf("BartConfig", "BartModel", vocab_size=1000, encoder_layers=2, decoder_layers=2,
                             d_model=768, encoder_attention_heads=12, decoder_attention_heads=12,
                             encoder_ffn_dim=3072, decoder_ffn_dim=3072), _seq2seq, "text"),
        ZooModel("marian", _hf("MarianConfig", "MarianModel", vocab_size=1000, encoder_layers=2, decoder_layers=2,
                               d_model=512, encoder_attention_heads=8, decoder_attention_heads=8,
                               encoder_ffn_dim=2048, decoder_ffn_dim=2048, decoder_start_token_id=0, pad_token_id=1),
                 _seq2seq, "text"),
        ZooModel("wav2vec2", _hf("Wav2Vec2Config", "Wav2Vec2Model", num_hidden_layers=2, hidden_size=384,
                                 num_attention_heads=6, intermediate_size=1536), _audio, "audio"),
        ZooModel("whisper_encoder", _hf("WhisperConfig", "WhisperModel", part="encoder", encoder_layers=2, d_model=384,
                                        encoder_attention_heads=6, encoder_ffn_dim=1536, num_mel_bins=80,
                                        max_source_positions=1500), _mel, "audio"),
    ]
}


#: torch's two ONNX exporters: TorchScript-based (``dynamo=False``) and torch.export-based.
EXPORTERS = ("classic", "dynamo")


def exporters_from(arg: str) -> list[str]:
    """``--exporters``: comma-separated exporter names, or ``both``."""
    names = [n.strip() for n in arg.split(",") if n.strip()]
    names = [e for n in names for e in (EXPORTERS if n == "both" else (n,))]
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown or not names:
        raise ValueError(f"unknown exporters {unknown or [arg]}; known: {', '.join(EXPORTERS)} or both")
    return list(dict.fromkeys(names))


def export(model: ZooModel, batch: int, exporter: str) -> tuple[bytes, dict[str, np.ndarray]]:
    """The ONNX bytes of ``model`` at ``batch`` from ``exporter`` ("classic" or "dynamo")
    and the inputs, named as in the graph."""
    if exporter not in EXPORTERS:
        raise ValueError(f"zoo: unknown exporter {exporter!r}; known: {', '.join(EXPORTERS)}")
    inputs = model.inputs(batch)
    return export_module(torch_module(model, list(inputs)), inputs, exporter), inputs


def torch_module(model: ZooModel, names: list[str]) -> Any:
    """``model`` built (random weights) and wrapped to take its inputs ``names`` in order
    and give one tensor: the first output (logits / last hidden state)."""
    import torch

    net = model.build().eval()
    positional = model.kind == "vision" and not model.keywords

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, *xs: Any) -> Any:
            out = self.net(*xs) if positional else self.net(**dict(zip(names, xs)))
            if isinstance(out, torch.Tensor):
                return out
            return out["out"] if isinstance(out, dict) and "out" in out else out[0]  # a segmentation model's dict

    return Wrapped().eval()  # eval as a whole: the exporter restores the mode it found


def export_module(module: Any, inputs: dict[str, np.ndarray], exporter: str, dynamic_batch: bool = False) -> bytes:
    """``module`` (a ``torch_module``) exported at ``inputs``' sizes; with ``dynamic_batch``
    (the classic exporter), every input's first axis is the symbolic dim ``batch``."""
    import torch

    names = list(inputs)
    args = tuple(torch.from_numpy(inputs[n]) for n in names)
    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "classic":
            axes = {n: {0: "batch"} for n in names} if dynamic_batch else None
            torch.onnx.export(module, args, buf, input_names=names, output_names=["y"], opset_version=17,
                              dynamo=False, dynamic_axes=axes)
            return buf.getvalue()
        if dynamic_batch:
            raise ValueError("zoo: a dynamic batch is exported with the classic exporter here")
        program = torch.onnx.export(module, args, input_names=names, output_names=["y"], dynamo=True)
        return program.model_proto.SerializeToString()


def _ort(data: bytes, inputs: dict[str, np.ndarray]) -> tuple[Any, list[np.ndarray]]:
    import onnxruntime as ort

    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    feed = {i.name: inputs[i.name] for i in sess.get_inputs()}
    return sess, sess.run(None, feed)


def check(names: list[str], exporters: list[str], batch: int, devices: list[str] | None,
          timing: tuple[int, float] | None = None, openvino: bool = False,
          precision: str | None = None) -> list[dict[str, Any]]:
    """Load each export with rlx, run it on each device, compare with ORT; with
    ``timing`` (rounds, seconds per measurement) also time them (``_time``), and with
    ``openvino`` OpenVINO beside them. ``precision`` (``bf16``): each device that declares
    it on this host also compiled at that precision, checked and timed beside (never part
    of auto's regret, which is float32's)."""
    import rlx_core
    from rlx_core.onnx import load

    rows = []
    for name in names:
        for exporter in exporters:
            row: dict[str, Any] = {"model": name, "exporter": exporter, "batch": batch}
            t0 = time.perf_counter()
            try:
                data, inputs = export(ZOO[name], batch, exporter)
            except Exception as exc:  # the exporter's failure, not rlx's
                row["export_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
                continue
            row["export_s"] = round(time.perf_counter() - t0, 1)
            sess, want = _ort(data, inputs)
            try:
                graph = load(data)
            except Exception as exc:
                row["load_error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
                continue
            feeds = {k: v for k, v in inputs.items() if k in {graph.node(i).name for i in graph.inputs}}
            compiled: dict[str, Any] = {}  # the devices that ran it: timed below, not compiled again
            for device in devices or list(rlx_core.available_devices()):
                try:
                    cg = rlx_core.compile(graph, device=device)
                    got = cg.run(feeds)[0]
                    same = got.shape == want[0].shape
                    err = float(np.max(np.abs(got.astype(np.float64) - want[0]))) if same else None
                    scale = float(np.max(np.abs(want[0]))) or 1.0
                    row[device] = {"max_abs_err": err, "rel": None if err is None else err / scale, "shape_ok": same}
                    compiled[device] = cg
                except Exception as exc:
                    row[device] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            rounded = _rounded(graph, feeds, want[0], list(compiled), precision, row) if precision else {}
            if timing is not None and compiled:
                row["time"] = _time(sess, inputs, want[0], graph, feeds, compiled, *timing, data=data,
                                    openvino=openvino, rounded=rounded)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def _rounded(graph: Any, feeds: dict[str, np.ndarray], want: np.ndarray, devices: list[str], precision: str,
             row: dict[str, Any]) -> dict[str, Any]:
    """``graph`` compiled at ``precision`` on each of ``devices`` that declares it here,
    keyed ``"<device> <precision>"``, each one's largest error relative to ORT's float32
    output recorded in ``row``."""
    import rlx_core

    out = {}
    for device in devices:
        if precision not in rlx_core.get_backend(device).precisions():
            continue
        key = f"{device} {precision}"
        try:
            cg = rlx_core.compile(graph, device=device, precision=precision)
            got = cg.run(feeds)[0].astype(np.float64)
            row[key] = {"rel": float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) or 1.0))}
            out[key] = cg
        except Exception as exc:
            row[key] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return out


def openvino_contenders(data: bytes, inputs: dict[str, np.ndarray]) -> list[Any]:
    """OpenVINO on its CPU device, at float32 (``INFERENCE_PRECISION_HINT=f32``) and at its
    default (bf16 on a CPU with AVX512_BF16 or AMX, else f32), each with its largest error
    relative to ORT's output in ``info``; none where openvino does not import."""
    try:
        import openvino as ov
    except ImportError:
        return []
    from bench._contenders import Contender

    core = ov.Core()
    model = core.read_model(data)
    order = [inputs[p.get_any_name()] for p in model.inputs]
    want = _ort(data, inputs)[1][0]
    out = []
    for name, config in (("openvino f32", {"INFERENCE_PRECISION_HINT": "f32"}), ("openvino default", {})):
        request = core.compile_model(model, "CPU", config).create_infer_request()

        def run(request: Any = request) -> np.ndarray:
            return np.asarray(request.infer(order)[0])
        got = run()
        err = float(np.max(np.abs(got.astype(np.float64) - want)) / (np.max(np.abs(want)) or 1.0))
        precision = str(request.get_compiled_model().get_property("INFERENCE_PRECISION_HINT"))
        out.append(Contender(name, "openvino", run, got, 0.0, 0.0, {"max_rel_err": err, "precision": precision}))
    return out


def _time(sess: Any, inputs: dict[str, np.ndarray], want: np.ndarray, graph: Any, feeds: dict[str, np.ndarray],
          compiled: dict[str, Any], rounds: int, target_s: float, data: bytes = b"",
          openvino: bool = False, rounded: dict[str, Any] | None = None) -> dict[str, Any]:
    """ORT (``sess``), rlx (each compiled device, and ``auto``) and, with ``openvino``,
    OpenVINO at float32 and at its default precision (the model's ONNX ``data``) timed
    interleaved (``bench/_timing.py``); ratios to ORT and to OpenVINO; whether auto's pick
    was the fastest device."""
    import rlx_core
    from bench._contenders import Contender
    from bench._timing import measure

    ort_feed = {i.name: inputs[i.name] for i in sess.get_inputs()}
    contenders = [Contender("onnxruntime", "onnxruntime", lambda: sess.run(None, ort_feed)[0], want, 0.0, 0.0)]
    contenders += openvino_contenders(data, inputs) if openvino else []
    auto = rlx_core.compile(graph)
    timed = {"auto": auto, **compiled, **(rounded or {})}
    for name, cg in timed.items():
        contenders.append(Contender(f"rlx {name}", "rlx", lambda cg=cg: cg.run(feeds)[0], cg.run(feeds)[0], 0.0, 0.0))
    timings = measure(contenders, rounds, 0.15, target_s)
    ort_s = timings["onnxruntime"].median
    out: dict[str, Any] = {"ort_ms": ort_s * 1e3, "auto_device": auto.device}
    for name in timed:
        out[f"{name.replace(' ', '_')}_ms"] = timings[f"rlx {name}"].median * 1e3
        out[f"{name.replace(' ', '_')}_vs_ort"] = timings[f"rlx {name}"].median / ort_s
    for c in contenders:
        if c.kind == "openvino":  # each rlx device against OpenVINO at that precision, too
            key = c.name.replace(" ", "_")
            out[f"{key}_ms"] = timings[c.name].median * 1e3
            out[f"{key}_max_rel_err"] = c.info["max_rel_err"]
            out[f"{key}_precision"] = c.info["precision"]
            for name in [*compiled, *(rounded or {})]:
                out[f"{name.replace(' ', '_')}_vs_{key}"] = timings[f"rlx {name}"].median / timings[c.name].median
    fastest = min(compiled, key=lambda d: timings[f"rlx {d}"].median)
    picked = auto.device.split(":")[0]
    out["auto_picked_fastest"] = picked == fastest
    out["auto_regret"] = (timings[f"rlx {picked}"].median / timings[f"rlx {fastest}"].median
                          if picked in compiled else None)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ZOO), help="comma-separated zoo names")
    parser.add_argument("--exporters", default="both", help="classic, dynamo, or both (comma-separated)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--devices", help="comma-separated rlx devices (default: every available one)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--time", action="store_true", help="also time rlx (each device, auto) against ORT")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds with --time")
    parser.add_argument("--target-ms", type=float, default=50.0, help="length of one measurement with --time")
    parser.add_argument("--openvino", action="store_true",
                        help="with --time, also time OpenVINO (f32 and its default precision) where it imports")
    parser.add_argument("--precision", choices=("bf16", "fp16"),
                        help="also run (and with --time, time) each device that declares this precision at it")
    args = parser.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("bench/zoo.py needs torch, torchvision and transformers (bench extras): nox -s zoo installs them",
              file=sys.stderr)
        return 2
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        parser.error(f"unknown zoo models {unknown}; known: {', '.join(ZOO)}")
    try:
        exporters = exporters_from(args.exporters)
    except ValueError as exc:
        parser.error(str(exc))
    timing = (args.rounds, args.target_ms / 1e3) if args.time else None
    rows = check(names, exporters, args.batch, args.devices.split(",") if args.devices else None,
                 timing, openvino=args.openvino, precision=args.precision)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
