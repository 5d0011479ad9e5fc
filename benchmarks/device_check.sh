#!/usr/bin/env bash
# The accelerator check of bert_jax, in one command (benchmarks/device_check.py says what it runs):
#   bash benchmarks/device_check.sh             # one GPU: at most 8 minutes
#   bash benchmarks/device_check.sh --dry_run   # any machine (CPU), tiny shapes: under 2 minutes
# Results: benchmarks/results/device_check.jsonl (--dry_run: device_check_dry_run.jsonl) and a
# table at the end of the output. Exit status: the check's (1: a configuration failed or bf16
# and f32 disagree; 124: the time limit).
#
# Environment:
#   PYTHON               the interpreter (default: .venv/bin/python if present, else python3)
#   BERT_JAX_WHEELS      a folder of wheels installed first (--no-index, into a temporary target
#                        put on PYTHONPATH) when the interpreter lacks grain, ml_collections or
#                        tensorflow_datasets (a GPU machine's image); default runs/device_wheels
#                        (benchmarks/device_wheels.sh fills it)
#   DEVICE_CHECK_LIMIT_S hard wall-time limit in seconds (default 480; 120 with --dry_run)
set -euo pipefail
cd "$(dirname "$0")/.."

dry_run=0
for arg in "$@"; do
  [[ "$arg" == "--dry_run" ]] && dry_run=1
done

if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

wheels="${BERT_JAX_WHEELS:-runs/device_wheels}"
if ! "$PYTHON" -c "import grain, ml_collections, tensorflow_datasets" 2> /dev/null \
    && compgen -G "$wheels/*.whl" > /dev/null; then
  site="$(mktemp -d /tmp/bert_jax_site.XXXXXX)"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    "$wheels"/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  echo "Installed $(ls "$wheels"/*.whl | wc -l) wheels from $wheels into $site"
fi

# XLA's GPU client takes 75% of the memory up front by default: the batch search wants more.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}"
export PYTHONUNBUFFERED=1
# This checkout's bert_jax and configs, installed or not (the processes it starts import them).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if (( dry_run )); then
  export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
  limit="${DEVICE_CHECK_LIMIT_S:-120}"
else
  limit="${DEVICE_CHECK_LIMIT_S:-480}"
fi
"$PYTHON" -c "import jax; print('jax', jax.__version__, 'on', jax.devices()[0].device_kind)"
exec timeout --signal=TERM --kill-after=10 "$limit" "$PYTHON" benchmarks/device_check.py "$@"
