#!/usr/bin/env bash
# Runs bert_jax pretraining on every worker of a Cloud TPU pod slice (TPU VM).
#
#   TPU_NAME=my-v4-32 ZONE=us-central2-b WORKDIR=gs://my-bucket/bert_base \
#   DATASET_DIR=gs://my-bucket/data/wiki CONFIG=configs/base.py bash launch/tpu_pod.sh
#
# The repository must be at ~/bert_jax on every worker (e.g. `gcloud compute tpus tpu-vm scp
# --worker=all --recurse . $TPU_NAME:~/bert_jax`). jax.distributed.initialize() finds the other
# workers by itself on TPU VMs (--distributed); every worker runs the same command, reads its own
# shard of the data and writes its share of each checkpoint. Only worker 0 logs.
# Extra arguments are passed on to launch/train.py, e.g. --config.train.batch_size=1024.
#
# WORKDIR may be a bucket: checkpoints, metrics, TensorBoard events and logs are written there.
# A DATASET_DIR in a bucket (from `prepare_data.py --output_dir=gs://...`) is mounted read-only
# with gcsfuse on every worker (ArrayRecord reads local files only; gcsfuse must be installed:
# https://cloud.google.com/storage/docs/gcsfuse-install) and read through the mount.
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}" "${WORKDIR:?set WORKDIR}"
CONFIG=${CONFIG:-configs/base.py}
DATASET_DIR=${DATASET_DIR:-}
DATA_FLAGS=""
MOUNT=""
if [ -n "$DATASET_DIR" ]; then
  if [[ "$DATASET_DIR" == gs://* ]]; then
    BUCKET=${DATASET_DIR#gs://}; BUCKET=${BUCKET%%/*}
    MOUNT="command -v gcsfuse >/dev/null || { echo 'error: DATASET_DIR is in a bucket: install gcsfuse on the workers' >&2; exit 1; }
  mkdir -p ~/gcs/$BUCKET
  mountpoint -q ~/gcs/$BUCKET || gcsfuse --implicit-dirs -o ro $BUCKET ~/gcs/$BUCKET"
    DATASET_DIR="\$HOME/gcs/${DATASET_DIR#gs://}"  # Expanded on the worker.
  fi
  DATA_FLAGS="--config.data.source=prepared --config.data.dataset_dir=$DATASET_DIR"
fi
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command="
  set -e
  $MOUNT
  cd ~/bert_jax
  if [ ! -d .venv ]; then
    python3.11 -m venv .venv && .venv/bin/pip install -q -r requirements.txt 'jax[tpu]==0.10.2'
  fi
  .venv/bin/python launch/train.py --distributed --config=$CONFIG --workdir=$WORKDIR \
      --config.model.dtype=bfloat16 $DATA_FLAGS $*
"
