#!/usr/bin/env bash
# One device call that measures what the GPU issues need, writing as it
# goes: benchmarks/model_steps.py (issue 40: thattn's Keras 3 BERT and T5
# steps against plain JAX and KerasHub) and then benchmarks/accelerator.py
# (issue 41: the Pallas talking-heads kernel against flash attention and
# the keras.ops path, at h = 12, 24, 48 and n = 1024, 4096, 16384).
#
#   bash benchmarks/gpu_session.sh OUT_DIR          # on the GPU machine
#   bash benchmarks/gpu_session.sh OUT_DIR --quick  # tiny sizes, any CPU
#
# The device machine has JAX but no Keras and no TensorFlow (CI runs both
# scripts' --quick sizes where TensorFlow cannot be imported:
# tests/benchmarks_smoke_test.py). Carry Keras's wheels in .whl/ (kept
# out of git by .gitignore), fetched for its Python 3.12 with
#   python3 -m pip download --no-deps --only-binary=:all: \
#     --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl \
#     keras==3.15.1 namex optree keras-hub==0.32.0
# and they are installed into /tmp/site first. MODEL_BUDGET and
# KERNEL_BUDGET (seconds after which each script starts no new
# measurement; defaults 300 and 200) keep the whole call inside one
# 10-minute device command, compiles included. PYTHON names the
# interpreter (default python3).
set -uo pipefail
out=${1:?usage: gpu_session.sh OUT_DIR [--quick]}
quick=${2:-}
python=${PYTHON:-python3}
mkdir -p "$out"
# Before the check below: Keras 3 with no backend named imports TensorFlow.
export KERAS_BACKEND=jax
if [ -d .whl ] && ! "$python" -c "import keras" 2>/dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-compile \
      --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# Fail in a second, not in each script, while the device is still warm.
if ! "$python" -c "import keras, keras_hub" 2>/dev/null; then
  echo "gpu_session.sh: Keras 3 or KerasHub does not import with $python;" \
       "carry their wheels in .whl/ (this file's header fetches them)" >&2
  exit 2
fi
kernel_sizes=(--heads 12,24,48 --lengths 1024,4096,16384
              --baseline_lengths 4096)
if [ "$quick" = "--quick" ]; then
  kernel_sizes=(--quick)
fi
status=0
"$python" benchmarks/model_steps.py --out "$out/model_steps" \
    --budget "${MODEL_BUDGET:-300}" $quick 2>&1 | tee "$out/model_steps.log"
status=$(( status | PIPESTATUS[0] ))
"$python" benchmarks/accelerator.py --out "$out/accelerator" \
    --budget "${KERNEL_BUDGET:-200}" "${kernel_sizes[@]}" 2>&1 |
    tee "$out/accelerator.log"
status=$(( status | PIPESTATUS[0] ))
exit "$status"
