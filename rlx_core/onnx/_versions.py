"""Which versions of each ONNX op the converters read, decided node by node.

A model's opset says which version of every op is in effect (``Softmax`` at opset 7 is
version 1, at opset 13 version 13). The converters were written and tested against the
versions in effect at opsets 11-21 (``WRITTEN_FOR``); they read a node when the version
in effect for it is one of those, whatever the model's opset number is:

- an older opset whose op has not changed since (``Abs`` at opset 7 is version 6, the
  same as at opset 11) is read; one that has (``Softmax`` 1, ``BatchNormalization`` 7)
  is refused by name, never converted with the newer meaning;
- a newer version is read when ONNX's own schemas (the spec, shipped with the installed
  ``onnx``) show that it changed nothing but the types it admits: the same attributes
  with the same defaults, the same inputs and outputs, the same text. Most of opsets
  22-25 is that (bfloat16, float8, int4 added to existing ops); rlx reads none of those
  types, so for the ones it reads the meaning is the one tested;
- a newer version whose text changed is read only when reviewed here (``REVIEWED``),
  with the reason.

Nothing is down-converted: the model's nodes are read as they are.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from ..errors import ModelError
from ._context import describe_node

__all__ = ["WRITTEN_FOR", "REVIEWED", "INTRODUCED_LATER", "OLDER_VERSIONS", "newest_opset", "readable_versions",
           "check_versions"]

#: The opsets whose op versions the converters were written and tested against.
WRITTEN_FOR = range(11, 22)
#: Later versions whose specification text changed, read after checking that rlx
#: already computes what the new text says.
REVIEWED: dict[tuple[str, int], str] = {
    ("AveragePool", 22): "adds that windows starting in the right padding are ignored with ceil_mode, "
                         "which the pool ops already do (rlx_core.ir.ops._window_out)",
    ("MaxPool", 22): "as AveragePool 22",
    ("Cast", 24): "adds round_mode, used only for casts to FLOAT8E8M0, a type rlx does not read",
    ("CastLike", 24): "as Cast 24",
    ("Range", 27): "adds float16/bfloat16 and stash_type (their accumulation precision); the Range converter "
                   "computes start + i * delta in float64 (rlx_core/onnx/_ops_tensor.py) and refuses stash_type 0",
    ("Attention", 24): "adds nonpad_kv_seqlen (an external cache's lengths: bottom-right causal offset and padding "
                       "mask) and zero rows for fully masked queries; rlx_core/onnx/_ops_attention.py does both",
    ("Attention", 25): "adds left_window_size/right_window_size (sliding windows, offset-aligned) and refuses "
                       "q_num_heads/kv_num_heads with 4-D inputs; the converter does both",
    ("BitShift", 28): "adds signed integer types (arithmetic right shift, wrapping left shift) and defines shifts "
                      "below 0 or at least the bit width (the sign fill); the IR's bit_shift_left/right ops "
                      "compute exactly that (rlx_core/reference.py)",
    ("SpaceToDepth", 28): "adds mode (DCR, the earlier order and the default, or CRD); the converter reads both "
                          "(rlx_core/onnx/_ops_layout.py)",
    ("Mod", 28): "defines fmod=0 for floats (A - floor(A/B)*B, the sign of B) and its special values; "
                 "the Mod converter branches on the opset for exactly that (rlx_core/onnx/_ops_indexing.py)",
    ("QuantizeLinear", 23): "adds 4-bit types, a scale of another type than x (the division in the scale's dtype) "
                            "and precision; the converter divides in the scale's dtype and refuses precision "
                            "(rlx_core/onnx/_ops_quant.py)",
    ("QuantizeLinear", 24): "adds float8e8m0 scales, a type rlx does not read",
    ("QuantizeLinear", 25): "adds int2/uint2 outputs, types rlx does not read",
    ("QuantizeLinear", 28): "adds float6 outputs, types rlx does not read",
    ("DequantizeLinear", 23): "adds 4-bit inputs and output_dtype (the output's type and the product's precision); "
                              "the converter computes in output_dtype (rlx_core/onnx/_ops_quant.py)",
    ("DequantizeLinear", 24): "as QuantizeLinear 24",
    ("DequantizeLinear", 25): "adds int2/uint2 inputs, types rlx does not read",
    ("DequantizeLinear", 28): "adds float6 inputs, types rlx does not read",
}


#: Ops that appeared after ``WRITTEN_FOR``: the versions their converters were written
#: and tested against (later versions follow the same rule as every other op's).
INTRODUCED_LATER: dict[str, frozenset[int]] = {
    "RMSNormalization": frozenset({23}),
    "CumProd": frozenset({26}),
    "Attention": frozenset({23}),
    "RotaryEmbedding": frozenset({23}),
    "TensorScatter": frozenset({24}),
    "LinearAttention": frozenset({27}),
    "CausalConvWithState": frozenset({27}),
    "SwiGLU": frozenset({28}),
}
#: Versions older than those of ``WRITTEN_FOR`` that a converter reads too, each checked
#: against the converter: an op removed since, or one whose later version only widened it.
OLDER_VERSIONS: dict[str, frozenset[int]] = {
    "Upsample": frozenset({7, 9}),  # scales as an attribute (7) or an input (9); Resize from opset 10
    # Scan 11 only allows negative axes, which the converter reads either way; Scan 8 (a batch
    # axis 0, the scan axis 1, sequence_lens, ``directions``) is read by its own branch of the
    # converter (rlx_core/onnx/_ops_control.py), equal sequence_lens only
    "Scan": frozenset({8, 9}),
    # Scatter 9 is ScatterElements 11 without negative indices (which 11 added) and without
    # reduction: the ScatterElements converter reads it as it is
    "Scatter": frozenset({9}),
}


def _onnx_defs() -> Any:
    from onnx import defs

    return defs


def newest_opset() -> int:
    """The newest default-domain opset the installed ``onnx`` knows."""
    return int(_onnx_defs().onnx_opset_version())


@functools.lru_cache(maxsize=4096)
def _in_effect(op_type: str, opset: int) -> int | None:
    """The version of ``op_type`` in effect at ``opset``; ``None`` when there is none."""
    try:
        return int(_onnx_defs().get_schema(op_type, opset, "").since_version)
    except Exception:  # SchemaError: not an op at that opset (or unknown to this onnx)
        return None


@functools.lru_cache(maxsize=1)
def _histories() -> dict[str, tuple[Any, ...]]:
    """Every default-domain op's schema versions, oldest first, by op type: built once
    (``get_all_schemas_with_history`` makes every schema of every domain, ~2 ms a call;
    asked per op type, a transformer's first load spent 40 ms there)."""
    found: dict[str, list[Any]] = {}
    for s in _onnx_defs().get_all_schemas_with_history():
        if s.domain in ("", "ai.onnx"):
            found.setdefault(s.name, []).append(s)
    return {name: tuple(sorted(v, key=lambda s: s.since_version)) for name, v in found.items()}


def _history(op_type: str) -> tuple[Any, ...]:
    """Every version of ``op_type``'s schema, oldest first."""
    return _histories().get(op_type, ())


def _signature(schema: Any) -> tuple[Any, ...]:
    """What a version means, less the types it admits: attributes (name, type, required,
    default), inputs and outputs (name, optional/variadic), their counts, and the text."""
    attrs = tuple(sorted((a.name, int(a.type), bool(a.required), a.default_value.SerializeToString())
                         for a in schema.attributes.values()))
    ins = tuple((i.name, int(i.option)) for i in schema.inputs)
    outs = tuple((o.name, int(o.option)) for o in schema.outputs)
    counts = (schema.min_input, schema.max_input, schema.min_output, schema.max_output)
    return attrs, ins, outs, counts, schema.doc


@functools.lru_cache(maxsize=1024)
def readable_versions(op_type: str) -> frozenset[int]:
    """The versions of ``op_type`` the converters read (see the module docstring)."""
    versions = {v for v in (_in_effect(op_type, o) for o in WRITTEN_FOR) if v is not None}
    versions |= INTRODUCED_LATER.get(op_type, frozenset()) | OLDER_VERSIONS.get(op_type, frozenset())
    if not versions:
        return frozenset()
    history = _history(op_type)
    newest = max(versions)
    previous = next((s for s in history if s.since_version == newest), None)
    for schema in history:
        if previous is None or schema.since_version <= newest:
            continue
        same = _signature(schema) == _signature(previous)
        if not same and (op_type, schema.since_version) not in REVIEWED:
            break  # this version changed the meaning: it and every later one are refused
        versions.add(schema.since_version)
        previous = schema
    return frozenset(versions)


def check_versions(nodes: Sequence[Any], opset: int, where: str) -> None:
    """One ``ModelError`` naming every default-domain node whose op version in effect at
    ``opset`` the converters do not read (unsupported op types are reported elsewhere)."""
    bad: dict[tuple[str, int], str] = {}
    for i, node in enumerate(nodes):
        if node.domain not in ("", "ai.onnx"):
            continue
        version = _in_effect(node.op_type, opset)
        readable = readable_versions(node.op_type)
        if version is None or not readable or version in readable:
            continue
        key = (node.op_type, version)
        if key not in bad:
            newer = "older" if version < min(readable) else "newer"
            bad[key] = (f"{describe_node(node, i)} is {node.op_type} version {version}, {newer} than the versions "
                        f"rlx reads ({', '.join(str(v) for v in sorted(readable))})")
    if bad:
        raise ModelError(f"{where}: at opset {opset}: " + "; ".join(bad.values())
                         + "; convert the model with onnx.version_converter.convert_version(model, "
                         f"{WRITTEN_FOR.stop - 1})")
