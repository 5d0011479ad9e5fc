#!/usr/bin/env bash
# Runs bert_jax pretraining on every worker of a Cloud TPU pod slice (TPU VM), in the background
# of each worker: a dropped ssh connection does not stop it.
#
#   TPU_NAME=my-v4-32 ZONE=us-central2-b WORKDIR=gs://my-bucket/bert_base \
#   DATASET_DIR=gs://my-bucket/data/wiki CONFIG=configs/base.py bash launch/tpu_pod.sh \
#       --config.train.batch_size=1024 --config.logging.profile_steps="(100, 5)"
#
#   bash launch/tpu_pod.sh --dry_run ...   prints the command each worker would run, runs nothing
#   bash launch/tpu_pod.sh --stop          SIGTERM to the run on every worker: it saves and exits 0
#
# Arguments other than --dry_run/--stop go to launch/train.py unchanged (quoting kept).
# The repository must be at ~/bert_jax on every worker, without a .venv from another machine:
#   gcloud compute tpus tpu-vm scp --zone=$ZONE --worker=all --recurse . $TPU_NAME:~/bert_jax
# (leave out .venv: a copied one has no libtpu, and is refused). On first use each worker creates
# ~/bert_jax/.venv with its own Python (>= 3.11: python3.13, 3.12, 3.11 or python3; or set PYTHON)
# and installs bert_jax with its tpu extra (libtpu). jax.distributed.initialize() finds the others
# by itself (--distributed); every worker runs the same command, reads its own shard of the data
# and writes its share of each checkpoint. Only worker 0 logs.
#
# Each worker's console goes to ~/bert_jax/tpu_pod.out (and the pid to ~/bert_jax/tpu_pod.pid);
# the full log is <WORKDIR>/train.log. Watch worker 0:
#   gcloud compute tpus tpu-vm ssh $TPU_NAME --zone=$ZONE --worker=0 \
#       --command='tail -f ~/bert_jax/tpu_pod.out'
#
# WORKDIR may be a bucket: checkpoints, metrics, TensorBoard events and logs are written there.
# A DATASET_DIR in a bucket (from `prepare_data.py --output_dir=gs://...`) is mounted read-only
# with gcsfuse on every worker (ArrayRecord reads local files only; gcsfuse must be installed:
# https://cloud.google.com/storage/docs/gcsfuse-install) and read through the mount.
set -euo pipefail
DRY_RUN=0
ACTION=train
TRAIN_ARGS=()
for arg in "$@"; do
  case "$arg" in
    --dry_run) DRY_RUN=1 ;;
    --stop) ACTION=stop ;;
    *) TRAIN_ARGS+=("$arg") ;;
  esac
done
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}"

if [ "$ACTION" = stop ]; then
  REMOTE='pid=$(cat ~/bert_jax/tpu_pod.pid 2>/dev/null || true)
if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
  kill -TERM "$pid" && echo "$(hostname): SIGTERM sent to $pid (it saves, then exits)"
else
  echo "$(hostname): no bert_jax run"
fi'
else
  : "${WORKDIR:?set WORKDIR}"
  CONFIG=${CONFIG:-configs/base.py}
  DATASET_DIR=${DATASET_DIR:-}
  MOUNT=""
  DATA_FLAGS=""
  if [ -n "$DATASET_DIR" ]; then
    if [[ "$DATASET_DIR" == gs://* ]]; then
      BUCKET=${DATASET_DIR#gs://}; BUCKET=${BUCKET%%/*}
      MOUNT="command -v gcsfuse >/dev/null || { echo \"\$(hostname): error: DATASET_DIR is in a bucket: install gcsfuse on the workers\" >&2; exit 1; }
mkdir -p ~/gcs/$(printf '%q' "$BUCKET")
mountpoint -q ~/gcs/$(printf '%q' "$BUCKET") || gcsfuse --implicit-dirs -o ro $(printf '%q' "$BUCKET") ~/gcs/$(printf '%q' "$BUCKET")"
      # Expanded on the worker: its own home directory.
      DATA_FLAGS="--config.data.source=prepared --config.data.dataset_dir=\"\$HOME\"/gcs/$(printf '%q' "${DATASET_DIR#gs://}")"
    else
      DATA_FLAGS="--config.data.source=prepared $(printf '%q' "--config.data.dataset_dir=$DATASET_DIR")"
    fi
  fi
  QUOTED_ARGS=""
  if [ ${#TRAIN_ARGS[@]} -gt 0 ]; then
    QUOTED_ARGS=$(printf ' %q' "${TRAIN_ARGS[@]}")
  fi
  PYTHON_CHOICE=$(printf '%q' "${PYTHON:-}")
  REMOTE="set -euo pipefail
$MOUNT
cd ~/bert_jax
if [ -e .venv ]; then
  .venv/bin/python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec(\"libtpu\") is None)' 2>/dev/null || {
    echo \"\$(hostname): error: ~/bert_jax/.venv has no libtpu (copied from another machine?); remove it (rm -rf ~/bert_jax/.venv on every worker) and launch again to create it here\" >&2; exit 1; }
else
  py=$PYTHON_CHOICE
  if [ -z \"\$py\" ]; then
    for candidate in python3.13 python3.12 python3.11 python3; do
      if command -v \$candidate >/dev/null && \$candidate -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then py=\$candidate; break; fi
    done
  fi
  [ -n \"\$py\" ] || { echo \"\$(hostname): error: no Python >= 3.11 on this worker (jax needs it): install one (e.g. sudo apt-get install python3.11 python3.11-venv) or set PYTHON\" >&2; exit 1; }
  \$py -m venv .venv
  .venv/bin/pip install -q -e '.[tpu]'
fi
if [ -e tpu_pod.pid ] && kill -0 \"\$(cat tpu_pod.pid)\" 2>/dev/null; then
  echo \"\$(hostname): error: a run is going on here (pid \$(cat tpu_pod.pid)); stop it with launch/tpu_pod.sh --stop\" >&2; exit 1
fi
nohup setsid .venv/bin/python launch/train.py --distributed --config=$(printf '%q' "$CONFIG") --workdir=$(printf '%q' "$WORKDIR") --config.model.dtype=bfloat16 $DATA_FLAGS$QUOTED_ARGS > tpu_pod.out 2>&1 < /dev/null &
echo \$! > tpu_pod.pid
echo \"\$(hostname): started (pid \$!); console in ~/bert_jax/tpu_pod.out\""
fi

if [ "$DRY_RUN" = 1 ]; then
  echo "# gcloud compute tpus tpu-vm ssh $(printf '%q' "$TPU_NAME") --zone=$(printf '%q' "$ZONE") --worker=all --command=<the following>" >&2
  printf '%s\n' "$REMOTE"
  exit 0
fi
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command="$REMOTE"
