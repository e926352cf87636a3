"""rlx-cpu's environment variables (``RLX_CPU_*``), declared once.

``CpuBackend.settings`` hands them to rlx-core's settings table, so every ``rlx`` command
parses them before any work and ``rlx devices --explain`` lists them; the modules that
act on them (``blas``, ``native``, ``gemm``, ``conv_choice``) read them through
``Setting.read``. Either way a value outside the accepted words is a ``ConfigError``
naming the variable, the value and the words: a typo such as ``RLX_CPU_GEMM=nativ``
used to mean ``auto`` without a word.
"""

from __future__ import annotations

from rlx_core.plugin import Setting

__all__ = ["BLAS", "NATIVE", "GEMM", "CONV", "BIND", "ONEDNN", "LAYOUT", "SWISH", "BF16", "POOL_MB", "ANY_SIZE",
           "PER_IMAGE", "SETTINGS"]

_ON = {"1": True, "on": True, "true": True, "yes": True}
_OFF = {"0": False, "off": False, "false": False, "no": False}

BLAS = Setting("RLX_CPU_BLAS", "auto (default) or mkl: float32 products and vector functions on oneMKL when the mkl "
               "extra is installed; numpy (or openblas, off, 0): numpy's BLAS for all of them",
               choices={"auto": True, "mkl": True, "1": True, "on": True,
                        "numpy": False, "openblas": False, "off": False, "0": False},
               default=True)
NATIVE = Setting("RLX_CPU_NATIVE", "1 (default): the native kernels built with rlx-cpu (native.c), where they "
                 "loaded; 0 (or off, numpy): numpy kernels only",
                 choices={**_ON, **_OFF, "numpy": False}, default=True)
GEMM = Setting("RLX_CPU_GEMM", "float32 products: auto (default: rlx's GEMM or the BLAS, timed on this host "
               "and kept a day), native (rlx's GEMM) or blas",
               choices={"auto": "auto", "native": "native", "blas": "blas"}, default="auto")
CONV = Setting("RLX_CPU_CONV", "convolutions: auto (default: timed on this host and kept a day), implicit (an "
               "implicit GEMM), im2col, or direct (the direct kernel for few taps)",
               choices={"auto": "auto", "implicit": "implicit", "im2col": "im2col", "direct": "direct"},
               default="auto")
BIND = Setting("RLX_CPU_BIND", "1 (default): pin OpenMP's worker threads one to a CPU each; 0 (or off): leave "
               "them where the OS puts them", choices={**_ON, **_OFF}, default=True)

ONEDNN = Setting("RLX_CPU_ONEDNN", "convolutions and dense layers' products on oneDNN (the onednn extra): auto "
                 "(default: where timed faster on this host, per kind, kept a day), on, or off (never loaded)",
                 choices={"auto": "auto", "on": "on", "1": "on", "off": "off", "0": "off"}, default="auto")

LAYOUT = Setting("RLX_CPU_LAYOUT", "auto (default): chains of convolutions held channels-last (NHWC) on oneDNN "
                 "where the onednn extra is installed, else on AVX-512 hosts chains of ungrouped convolutions on "
                 "rlx's channels-inner kernel (layout.py); nchw: every value NCHW",
                 choices={"auto": "auto", "nhwc": "auto", "nchw": "nchw"}, default="auto")

SWISH = Setting("RLX_CPU_SWISH", "a convolution's SiLU on oneDNN: auto (default: as its swish post-op or as a native "
                "region after it, whichever timed faster on this host, kept a day; swish.py), post-op, or region",
                choices={"auto": "auto", "post-op": "post-op", "region": "region"}, default="auto")

BF16 = Setting("RLX_CPU_BF16", "under precision='bf16': auto (default: bf16 operands where the CPU's unit makes them "
               "pay: AMX; AVX512-BF16 as timed on this host, kept a day; bf16_units.py), on (AVX512-BF16 untimed), "
               "or off (every product stays float32)",
               choices={"auto": "auto", "on": "on", "1": "on", "off": "off", "0": "off"}, default="auto")


def _megabytes(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError("expected a whole number of megabytes >= 0")
    return value


POOL_MB = Setting("RLX_CPU_POOL_MB", "megabytes of dead plans' buffers kept warm for the next plans (a new shape "
                  "class then faults in no fresh memory): default 256, 0 turns it off", parse=_megabytes, default=256)

ANY_SIZE = Setting("RLX_CPU_ANY_SIZE", "1 (default): a graph with symbolic dims runs every new size on one executable "
                   "whose kernels read their sizes per run, no compile (anysize.py; graphs with convolutions or "
                   "pools excepted); 0 (or off): each shape class compiled on its own",
                   choices={**_ON, **_OFF}, default=True)

PER_IMAGE = Setting("RLX_CPU_PER_IMAGE", "1 (default): at batch > 1, runs of layers with large values per image "
                    "(a mobile net's first blocks) run image by image, each image's values staying in cache "
                    "(images.py); 0 (or off): every node over the whole batch",
                    choices={**_ON, **_OFF}, default=True)

SETTINGS: tuple[Setting, ...] = (BLAS, NATIVE, GEMM, CONV, BIND, ONEDNN, LAYOUT, SWISH, BF16, POOL_MB, ANY_SIZE,
                                 PER_IMAGE)
