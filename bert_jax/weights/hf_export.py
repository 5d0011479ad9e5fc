"""A fine-tuned checkpoint as the HuggingFace task model that computes it (`launch/convert.py
--from_bert_jax=WORKDIR --to_hf=OUT`): BertForSequenceClassification (classification and
regression), BertForTokenClassification and BertForQuestionAnswering for exact BERT, and
ModernBertFor* for the modern encoder, with config.json's id2label / label2id (and
problem_type) and the tokenizer, so `AutoModelFor...` and HF pipelines serve it with its label
names. Its logits are `predict.outputs`' (QA: at the passage and [CLS], the positions
bert_jax's decoding reads; bert_jax masks the others).

The head a run trains is HF's of the encoder's family (`tasks/finetuning.py`), so the export is
a renaming; a checkpoint fine-tuned with the other family's head (config.head.kind set so) is
refused, as no HF class computes it.
"""

import jax

from bert_jax import predict, tasks
from bert_jax.checkpoints import checkpointing
from bert_jax.weights import hf
from bert_jax.weights.layout import unpad_vocab


def is_finetuned(path: str) -> bool:
  """Whether `path` holds a fine-tuned checkpoint of a registered task (what `export` reads)."""
  step_dir = checkpointing.find_step_dir(path)
  if step_dir is None:
    return False
  saved_task = checkpointing.read_meta(step_dir).get("task")
  return isinstance(saved_task, dict) and saved_task.get("name") in tasks.FINETUNE_TASKS


def export(path: str, output_dir: str, overwrite: bool = False) -> str:
  """Writes the task model of the fine-tuned checkpoint at `path` (a workdir, its best/ or a
  step directory) to `output_dir`; -> the architecture written."""
  finetuned = predict.load_finetuned(path)
  task = finetuned.task
  family = hf.hf_family(task.model_config)
  if not task.hf_task:
    raise ValueError(f"{path}: task {task.name!r} has no HuggingFace task model; "
                     "--encoder_only exports its encoder")
  if family != task.settings.head:
    raise ValueError(f"{path} was fine-tuned with {task.settings.head}'s head on a {family} "
                     f"encoder (config.head.kind), which no HuggingFace class computes; "
                     "--encoder_only exports its encoder")
  config, params = unpad_vocab(task.model_config, jax.device_get(finetuned.params))
  encoder = {tasks.ENCODER: params[tasks.ENCODER]}
  return hf.save_hf(output_dir, encoder, config, finetuned.vocab, overwrite,
                    head=task.hf_head(params))
