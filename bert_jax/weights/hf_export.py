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

import json

import jax

from bert_jax import predict, tasks
from bert_jax.checkpoints import checkpointing
from bert_jax.runtime import storage
from bert_jax.weights import files, hf
from bert_jax.weights import sentence_transformers_dir as st_dir
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
  if task.exports_pretraining_heads:
    config, params = unpad_vocab(task.model_config, jax.device_get(finetuned.params))
    return hf.save_hf(output_dir, params, config, finetuned.vocab, overwrite, task=task.name)
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


def export_sentence_transformers(path: str, output_dir: str, overwrite: bool = False) -> str:
  """Writes the embedding model fine-tuned at `path` (a workdir, its best/ or a step directory)
  as a sentence-transformers directory; -> what was written, in words."""
  finetuned = predict.load_finetuned(path)
  task = finetuned.task
  if not isinstance(task, tasks.EmbeddingTask):
    raise ValueError(f"{path} was fine-tuned for {task.name!r}, not as an embedding model "
                     "(config.task='embedding'): --to_hf exports it")
  config, params = unpad_vocab(task.model_config, jax.device_get(finetuned.params))
  with files.output_dir_in_place(output_dir, overwrite) as staged:  # Whole or nothing.
    architecture = hf.save_hf(staged, {tasks.ENCODER: params[tasks.ENCODER]}, config,
                              finetuned.vocab)
    settings = task.settings
    modules = [{"idx": 0, "name": "0", "path": "", "type": f"{st_dir.MODULES}.Transformer"},
               {"idx": 1, "name": "1", "path": st_dir.POOLING_DIR, "type": f"{st_dir.MODULES}.Pooling"}]
    if settings.normalize:
      modules.append({"idx": 2, "name": "2", "path": st_dir.NORMALIZE_DIR, "type": f"{st_dir.MODULES}.Normalize"})
      storage.makedirs(storage.join(staged, st_dir.NORMALIZE_DIR))
    storage.makedirs(storage.join(staged, st_dir.POOLING_DIR))
    contents = {
        "modules.json": modules,
        f"{st_dir.POOLING_DIR}/config.json": st_dir.pooling_config(settings.pooling, config.hidden_size),
        "sentence_bert_config.json": {"max_seq_length": settings.max_seq_length,
                                      "do_lower_case": bool(finetuned.vocab is not None
                                                            and finetuned.vocab.lower_text)},
        "config_sentence_transformers.json": {"similarity_fn_name": "cosine", "prompts": {},
                                              "default_prompt_name": None,
                                              "model_type": "SentenceTransformer"},
    }
    for name, content in contents.items():
      storage.write_text(storage.join(staged, name), json.dumps(content, indent=2) + "\n")
  return (f"a sentence-transformers model ({architecture} encoder, {settings.pooling} pooling"
          f"{', normalised' if settings.normalize else ''})")
