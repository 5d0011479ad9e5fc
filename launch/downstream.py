r"""GLUE, SQuAD or the local suite in one command: fine-tunes a pretrained encoder on every task
of a suite over a grid of learning rates and seeds, and tabulates the dev scores.

  python launch/downstream.py --checkpoint=runs/base --suite=glue --output_dir=runs/glue
  python launch/downstream.py --checkpoint=hf/bert-base-uncased --suite=glue \
      --tasks=cola,sst2,mrpc,stsb --learning_rates=2e-5,3e-5,5e-5 --seeds=5 \
      --output_dir=runs/glue_base
  python launch/downstream.py --checkpoint=runs/base --suite=squad1 --learning_rates=5e-5 \
      --seeds=3 --output_dir=runs/squad1
  python launch/downstream.py --checkpoint=runs/tiny --suite=local --output_dir=runs/local \
      --config.train.num_train_epochs=1
  python launch/downstream.py --checkpoint=runs/embed --suite=beir --data_dir=beir/scifact \
      --output_dir=runs/beir_scifact

Flags:
- `--checkpoint`: the encoder, anything `config.init_from` takes (a bert_jax pretraining or
  fine-tuning workdir, a pretrained directory, a HuggingFace directory, a TF checkpoint: give
  `--config.vocab` for one without a vocabulary).
- `--suite`: `glue` (CoLA, SST-2, MRPC, QQP, STS-B, MNLI, QNLI, RTE from TFDS `glue/*`; WNLI left
  out, as BERT did), `squad1` (TFDS `squad/v1.1`), `squad2` (`squad/v2.0`, questions without an
  answer), `local` (`bert_jax/data/local_suite.py`: offline tasks built from installed
  docstrings). `--tasks=cola,sst2` runs some of them, in that order. `beir`: zero-shot retrieval
  of an embedding model (an embedding run, a sentence-transformers or HF directory) on
  `--data_dir`, a task in BEIR's layout (corpus.jsonl, queries.jsonl, qrels/test.tsv) or a
  directory of them (`bert_jax/downstream/beir.py`): nDCG@10, MRR@10, recall@100 and MAP in
  results.json and results.md; nothing is fine-tuned. `local_retrieval`: the same on the offline
  retrieval suite (`bert_jax/data/local_retrieval.py`: numpy / scipy function summaries as
  queries, their parameter descriptions as documents, split by source file), built into
  `<output_dir>/data` with its train.jsonl / validation.jsonl for `configs/finetune_embedding.py`.
- `--learning_rates` (default BERT's grid 2e-5,3e-5,4e-5,5e-5) and `--seeds` (default 5: seeds
  0-4): one run per (task, learning rate, seed).
- `--output_dir`: `runs/<task>/lr<lr>_seed<seed>/` (each a `launch/finetune.py` workdir:
  checkpoints, best/, metrics.jsonl, train.log, final_eval.json, and downstream_scores.json),
  `results.json` (every run's scores, steps and workdir; per task the chosen learning rate and
  the medians) and `results.md` (one row per task; for GLUE, BERT's average).
- `--config` (default configs/finetune_base.py) and `--config.a.b=value` overrides: the base of
  every run. The suite sets BERT's recipe on it (batch 32, 3 epochs, warmup 10%, one evaluation
  at the end; max_seq_length 128 for GLUE, 384 with doc_stride 128 for SQuAD); an override given
  here wins (e.g. `--config.train.num_train_epochs=2`, `--config.model.dtype=bfloat16`), except
  for the fields the suite's flags set (seed, task, init_from, learning rate, data source).
- `--devices_per_run=N`: split the local devices into groups of N, one process per group, and
  spread the runs over them (longest first onto the least loaded group); 0 (default): each run on
  all devices, one after another.

Scores (x 100 in results.md) are on the dev sets: GLUE's official metrics from the predictions
of each run's best export (the final model under the recipe): CoLA MCC, MRPC / QQP F1 and
accuracy, STS-B Spearman and Pearson, MNLI matched and mismatched accuracy (the mismatched dev set
is a second evaluation of the same model), accuracy for the others; SQuAD's F1 and exact match
(v2.0: also HasAns / NoAns and best F1). Per task the learning rate with the highest median of
the main metric (the first listed) over the seeds is chosen, and every metric is reported as the
median over the seeds at it.

Resume: a run whose final_eval.json exists is never trained again; start the same command again
after a crash or a kill and the suite continues at its first unfinished run (a run cut off in the
middle resumes from its last checkpoint). The same --output_dir with other settings (any field of
the seed, encoder, model, head, data or train) is refused in one line before anything runs. TFDS downloads and prepares GLUE / SQuAD on first use
(internet access then). Bad flags end with one line, `error: --flag=value: why`.
"""

import os
import sys

from bert_jax.runtime import cli
from bert_jax.downstream import suite as downstream

downstream.define_flags("configs/finetune_base.py")


def main() -> None:
  downstream.run_from_flags([os.path.abspath(sys.argv[0]), *sys.argv[1:]])


if __name__ == "__main__":
  sys.argv = downstream.with_default_config(sys.argv)
  cli.run(main, after_interrupt="a restart goes on with the interrupted run, from its last "
                                  "complete checkpoint")
