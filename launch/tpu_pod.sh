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
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}" "${WORKDIR:?set WORKDIR}"
CONFIG=${CONFIG:-configs/base.py}
DATASET_DIR=${DATASET_DIR:-}
DATA_FLAGS=""
if [ -n "$DATASET_DIR" ]; then
  DATA_FLAGS="--config.data.source=prepared --config.data.dataset_dir=$DATASET_DIR"
fi
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command="
  set -e
  cd ~/bert_jax
  if [ ! -d .venv ]; then
    python3.11 -m venv .venv && .venv/bin/pip install -q -r requirements.txt 'jax[tpu]==0.10.2'
  fi
  .venv/bin/python launch/train.py --distributed --config=$CONFIG --workdir=$WORKDIR \
      --config.model.dtype=bfloat16 $DATA_FLAGS $*
"
