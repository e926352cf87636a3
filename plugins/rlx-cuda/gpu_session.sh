#!/usr/bin/env bash
# What a session lent an NVIDIA GPU runs, in one go, from the repository root.
#
# The machine is bare and offline: rlx's own wheels (and any dependency its image lacks)
# travel in .whl/ (`pip wheel --no-deps -w .whl . plugins/rlx-cpu plugins/rlx-cuda
# plugins/rlx-jax-tpu` plus `pip download platformdirs`), are installed into python3,
# and every step writes its log under $OUT so that a step killed at its limit still
# leaves what it printed. Steps run most important first, each under its own timeout:
# the CUDA plugin's suite, the zoo against torch eager, the GPU benchmarks, the zoo on cuda, the jax plugin's suite on
# the GPU, then the core suite with the GPU backends installed.
set -u
OUT=${OUT:-/tmp/rlx-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
if [ -d .whl ]; then  # into the interpreter itself: the CLI tests' subprocesses drop PYTHONPATH
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade .whl/*.whl || exit 1
fi

STEPS=${STEPS:-env cuda_tests zoo_gpu bench_gpu zoo_cuda jax_tests core_tests}  # a shorter list when device time is short

step() {  # step NAME SECONDS COMMAND...: run with a limit, log to $OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  case " $STEPS " in *" $name "*) ;; *) return 0 ;; esac
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - start)) s"
  tail -n 4 "$OUT/$name.log"
}

step env 60 bash -c "nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader; $PY -c 'import sys, numpy, cupy, jax, torch, onnx, onnxruntime; print(sys.version); [print(m.__name__, m.__version__) for m in (numpy, cupy, jax, torch, onnx, onnxruntime)]; print(jax.devices()); print(\"torch cudnn\", torch.backends.cudnn.version())'; rlx devices --explain"
step cuda_tests 150 $PY -m pytest -q -p no:cacheprovider --import-mode=importlib plugins/rlx-cuda/tests
# The zoo at batch 1 and 32: rlx cuda (cuDNN on and off) and jax against torch eager, auto's regret.
step zoo_gpu ${ZOO_GPU_SECONDS:-300} env XLA_PYTHON_CLIENT_PREALLOCATE=false $PY plugins/rlx-cuda/bench_gpu_zoo.py \
  --no-cudnn-too --json "$OUT/zoo-gpu.jsonl" ${ZOO_GPU_ARGS:-}
step bench_gpu 120 $PY plugins/rlx-cuda/bench_gpu.py --json "$OUT/cuda-bench.json"
step zoo_cuda 200 $PY bench/zoo.py --exporters classic --devices cuda,cpu --time --rounds 3 --target-ms 20 --json "$OUT/zoo-cuda.json"
step jax_tests 120 $PY -m pytest -q -p no:cacheprovider --import-mode=importlib plugins/rlx-jax-tpu/tests
# Several workers each starting JAX on the GPU would each reserve 75% of its memory.
step core_tests 240 env XLA_PYTHON_CLIENT_PREALLOCATE=false $PY -m pytest -q -p no:cacheprovider --import-mode=importlib -n 8 tests
