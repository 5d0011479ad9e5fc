"""Conditional masked diffusion (#41's SFT variant, task "diffusion_sft"): the prompt is never
masked, the loss covers the response only, and a fine-tuned model generates the response of its
prompt through launch/predict.py's generate path."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import predict
from bert_jax.data.vocab import Vocab
from bert_jax.finetune import finetune_and_evaluate
from bert_jax.generation import diffusion as sampler
from bert_jax.models.model import BertConfig
from bert_jax.objectives import diffusion
from bert_jax.tasks.diffusion_sft import DiffusionSftSettings, DiffusionSftTask
from bert_jax.weights import hf_export
from configs import finetune_diffusion_sft

pytestmark = pytest.mark.usefixtures("one_device")

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SUBJECTS = ["cat", "dog", "bird", "fox", "cow", "pig", "duck", "goat"]
ANSWERS = ["mat", "rug", "sofa", "chair", "bed", "table", "floor", "box", "desk", "shelf",
           "stool", "bench"]
WORDS = SUBJECTS + ANSWERS + ["where", "does", "the", "sleep", "?", "on", "a", "it"]
MODEL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             max_position_embeddings=64, hidden_dropout_prob=0.0,
             attention_probs_dropout_prob=0.0)


def _vocab(tmp_path) -> tuple[str, Vocab]:
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(SPECIALS + sorted(set(WORDS))) + "\n")
  return str(path), Vocab.load(str(path))


def _pairs() -> list[dict]:
  """A response of four fixed words per subject: only the prompt tells which."""
  rng = np.random.default_rng(0)
  return [{"prompt": f"where does the {s} sleep ?",
           "response": " ".join(rng.choice(ANSWERS, 4, replace=False))} for s in SUBJECTS]


def _task(vocab: Vocab, length: int = 16) -> DiffusionSftTask:
  config = BertConfig(vocab_size=vocab.size, **MODEL)
  settings = DiffusionSftSettings(labels=(), max_seq_length=length, head_dropout_prob=0.0,
                                  freeze_encoder=False,
                                  **DiffusionSftSettings.vocab_values(vocab))
  return DiffusionSftTask(config, settings)


def test_the_prompt_is_never_masked_and_only_the_response_carries_loss(tmp_path):
  """Over many keys every response piece is masked at some t and no other position ever is; the
  loss's gradient reaches the logits of masked response pieces only, and its count is the
  batch's response pieces."""
  _, vocab = _vocab(tmp_path)
  task = _task(vocab)
  records = [("pairs", i, r) for i, r in enumerate(_pairs())]
  data = task.encode(records, vocab)
  batch = {k: jnp.asarray(v) for k, v in data.arrays.items()}
  response = np.asarray(data.arrays["response_mask"], bool)  # [B, L]
  ids = np.asarray(data.arrays["input_ids"])
  # [CLS] where does the s sleep ? [SEP] w w w w [SEP]: the response's 4 pieces after 8.
  np.testing.assert_array_equal(response.sum(1), 4)
  assert response[:, 8:12].all() and not response[:, :8].any() and not response[:, 12:].any()
  np.testing.assert_array_equal(data.arrays["token_type_ids"][:, 8:13], 1)

  ever_masked = np.zeros_like(response)
  prepare = jax.jit(task.prepare)
  for k in range(200):  # Row 0 draws t in [0, 1/8): it masks least.
    prepared = prepare(batch, jax.random.key(k), jnp.int32(0))
    masked = np.asarray(prepared["input_ids"]) == vocab.mask_id
    assert not (masked & ~response).any()
    np.testing.assert_array_equal(np.asarray(prepared["input_ids"])[~masked], ids[~masked])
    ever_masked |= masked
  assert ever_masked[response].all()

  counts = task.loss_counts(prepared)
  assert float(counts["loss_count"]) == response.sum()
  logits = jax.random.normal(jax.random.key(1), (*ids.shape, vocab.size), jnp.float32)
  grad = jax.grad(lambda x: diffusion.diffusion_sums(
      x, prepared, "linear", task.settings.control_ids)["diffusion_loss_sum"])(logits)
  # The logits are at the P = L slots; slot p of row b reads position masked_lm_positions[b, p].
  reached = np.abs(np.asarray(grad)).sum(-1) > 0  # [B, P]
  np.testing.assert_array_equal(reached, np.asarray(prepared["masked_lm_weights"]) > 0)
  positions = np.asarray(prepared["masked_lm_positions"])
  at = np.zeros_like(response)
  for row in range(len(ids)):
    at[row, positions[row][reached[row]]] = True
  np.testing.assert_array_equal(at, np.asarray(prepared["input_ids"]) == vocab.mask_id)
  assert at.any() and not (at & ~response).any()


def test_bad_records_and_lengths_are_named(tmp_path):
  _, vocab = _vocab(tmp_path)
  task = _task(vocab)
  with pytest.raises(ValueError, match="line 3: field 'response' is empty"):
    task.encode([("f", 3, {"prompt": "where", "response": " "})], vocab)
  with pytest.raises(ValueError, match="line 5: field 'response' encodes to no piece of the "
                     r"vocabulary \(only characters it drops\)$"):
    task.encode([("f", 5, {"prompt": "where", "response": "\u200b\u200b"})], vocab)
  with pytest.raises(ValueError, match="line 6: field 'prompt' encodes to no piece"):
    task.encode([("f", 6, {"prompt": "\u200b", "response": "mat"})], vocab)
  with pytest.raises(ValueError, match="line 4: missing field 'prompt'"):
    task.encode([("f", 4, {"response": "mat"})], vocab)
  # A long pair keeps the prompt's last pieces and the response's first, both counted.
  data = _task(vocab, length=10).encode(
      [("f", 1, {"prompt": "where does the cat sleep ?", "response": "on a mat on a rug"})], vocab)
  assert data.num_truncated == 1
  row = [vocab.decode([i]) for i in data.arrays["input_ids"][0]]
  # 7 positions between the specials: the prompt keeps 3 (room // 2), the response 4.
  assert row == ["[CLS]", "cat", "sleep", "?", "[SEP]", "on", "a", "mat", "on", "[SEP]"]
  with pytest.raises(ValueError, match="eval_points=0"):
    DiffusionSftSettings(labels=(), max_seq_length=16, head_dropout_prob=0.0,
                         freeze_encoder=False, eval_points=0, **DiffusionSftSettings.vocab_values(vocab))


def test_fine_tuned_model_answers_its_prompts_and_exports_its_mlm_head(tmp_path):
  """From scratch on eight prompt -> response pairs: the validation reports the bound, the best
  checkpoint generates each prompt's response (the prompt alone tells which), needs a prompt,
  and exports with its MLM head."""
  vocab_file, vocab = _vocab(tmp_path)
  pairs = _pairs()
  for name in ("train", "dev"):
    (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs * 4))
  config = finetune_diffusion_sft.get_config()
  config.vocab = vocab_file
  config.model.update(MODEL)
  config.data.update(train_file=str(tmp_path / "train.jsonl"),
                     validation_file=str(tmp_path / "dev.jsonl"), max_seq_length=16)
  config.train.update(batch_size=32, num_train_steps=300, learning_rate=2e-3, warmup_steps=20,
                      log_every_steps=100, eval_every_steps=150, eval_batch_size=32)
  config.logging.tensorboard = False
  workdir = str(tmp_path / "run")
  summary = finetune_and_evaluate(config, workdir)
  final = summary["final"]
  assert {"elbo_nats_per_token", "elbo_perplexity_bound", "token_accuracy"} <= set(final)
  # Uniform over the 29 pieces it may propose is 3.37 nats, the answers' marginal about 2.1: the
  # prompt decides the response (0.018 nats, accuracy 1.0 measured).
  assert final["elbo_nats_per_token"] < 0.2, final
  assert final["token_accuracy"] > 0.95, final

  settings = sampler.SamplerSettings(steps=4, rule="confidence")
  answered = sum(predict.generate(workdir, 4, settings, p["prompt"])[0]["text"] == p["response"]
                 for p in pairs)
  assert answered >= 7, answered
  with pytest.raises(ValueError, match="diffusion_sft fine-tune: it generates a response"):
    predict.generate(workdir, 4, settings)
  architecture = hf_export.export(workdir, str(tmp_path / "hf"))
  assert architecture == "BertForPreTraining", architecture
  # The export generates in the fine-tune's own layout: the workdir's texts, prompt required.
  exported = str(tmp_path / "hf")
  assert json.load(open(os.path.join(exported, "config.json")))["bert_jax_task"] == "diffusion_sft"
  assert predict.conditional(exported) and not predict.conditional(str(tmp_path))
  settings = sampler.SamplerSettings(steps=4)  # Ancestral: the seed matters.
  for p in pairs[:3]:
    assert predict.generate(exported, 4, settings, p["prompt"], seed=5) == \
        predict.generate(workdir, 4, settings, p["prompt"], seed=5)
  with pytest.raises(ValueError, match="diffusion_sft fine-tune: it generates a response"):
    predict.generate(exported, 4, settings)
