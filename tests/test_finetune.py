"""Fine-tuning and inference on small synthetic tasks (in process on one device, `one_device`):
learning far above chance (classification, BIO tagging, extractive QA), a frozen encoder left
bit-identical, a pretrained encoder beating scratch, fill-mask after pretraining, the launchers,
bad input."""

import dataclasses
import json
import os
import random
import subprocess
import sys
import time

import jax
import ml_collections
import numpy as np
import pytest

from bert_jax import finetune, predict, tasks
from bert_jax.training import evaluation, programs, sharding
from bert_jax.training.settings import TrainSettings
from bert_jax.models import model as model_lib
from bert_jax import train, weights
from bert_jax.data import finetune as finetune_data
from bert_jax.weights import layout
from bert_jax.models.model import BertConfig
from bert_jax.tasks import classification, qa, tagging
from bert_jax.data import prepare
from bert_jax.data.vocab import Vocab, train_sentencepiece
from configs import finetune_classification, finetune_qa, finetune_tagging, tiny
from tests.sigterm_at import SigtermAt
from tests.suite_flags import xla_flags
from tests import forked_launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# ------------------------------------------------------------------------ synthetic corpus
# Pretraining sentences "the <animal> <verb> on the <object> ." put the two word classes in
# different slots, so MLM learns which words are animals: a classifier trained on half of the
# animals / objects then transfers to the other half only if the encoder was pretrained.
ANIMALS = ["cat", "dog", "bird", "horse", "cow", "fox", "mouse", "rabbit", "goat", "pig", "duck",
           "sheep"]
OBJECTS = ["mat", "rug", "sofa", "chair", "bed", "table", "floor", "box", "bench", "desk",
           "shelf", "stool"]
VERBS = ["sat", "slept", "lay", "stood"]
GLUE_WORDS = ["the", "a", "on", "under", "near", ".", "there", "is", "here", "look", "at", "i",
              "saw"]
TEMPLATES = ["the {} is here .", "look at the {} .", "i saw a {} there .", "there is a {} ."]
PRETRAIN_MODEL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=128, max_position_embeddings=64)

# ------------------------------------------------------------------------ task vocabulary
FILLER = "we saw it there today and then they went home with some friends in town at night".split()
NAMES = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi"]
SURNAMES = ["Smith", "Jones", "Brown", "Lee"]
COLORS = ["red", "blue", "green", "yellow", "black", "white"]
SENTIMENT = {"pos": ["good", "great"], "neg": ["bad", "awful"]}
QUESTIONS = {"person": "who paid?", "number": "how many?", "color": "what color?"}
TASK_MODEL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)

pytestmark = pytest.mark.usefixtures("one_device")


def _write_vocab(path, words) -> str:
  digits = [str(d) for d in range(10)]
  tokens = SPECIALS + sorted(set(words)) + digits + ["##" + d for d in digits]
  with open(path, "w") as f:
    f.write("\n".join(tokens) + "\n")
  return str(path)


def _task_vocab(tmp_path) -> str:
  """A cased WordPiece vocabulary: whole words, and numbers split into digit pieces."""
  words = (FILLER + NAMES + SURNAMES + COLORS + sum(SENTIMENT.values(), [])
           + " ".join(QUESTIONS.values()).replace("?", " ?").split() + [".", "?", "paid"])
  return _write_vocab(tmp_path / "vocab.txt", words)


def write_jsonl(path, rows) -> str:
  with open(path, "w") as f:
    f.writelines(json.dumps(row) + "\n" for row in rows)
  return str(path)


def _task(name, labels=(), max_length=128, max_query_length=64, doc_stride=128,
          regression=False, max_answer_length=30) -> tasks.FinetuneTask:
  """A fine-tuning task with these settings (its model is never built here)."""
  task_class = tasks.finetune_task(name)
  values = dict(labels=tuple(labels), max_seq_length=max_length, head_dropout_prob=0.1,
                freeze_encoder=False, regression=regression, max_query_length=max_query_length,
                doc_stride=doc_stride, max_answer_length=max_answer_length)
  fields = {f.name for f in dataclasses.fields(task_class.settings_class)}
  settings = task_class.settings_class(**{k: v for k, v in values.items() if k in fields})
  return task_class(BertConfig(), settings)


def _encode(name, records, vocab, *, with_labels=True, is_training=False, **settings):
  return _task(name, **settings).encode(records, vocab, with_labels=with_labels,
                                        is_training=is_training)


def _keyword_rows(n, rng):
  rows = []
  for _ in range(n):
    words = rng.sample(FILLER, rng.randint(3, 7))
    label = rng.choice(["neg", "pos"])
    words.insert(rng.randint(0, len(words)), rng.choice(SENTIMENT[label]))
    rows.append({"text": " ".join(words), "label": label})
  return rows


def _tagging_rows(n, rng):
  rows = []
  for _ in range(n):
    words, tags = [], []
    for _ in range(rng.randint(4, 9)):
      draw = rng.random()
      if draw < 0.2:
        words.append(rng.choice(NAMES))
        tags.append("B-PER")
        if rng.random() < 0.5:
          words.append(rng.choice(SURNAMES))
          tags.append("I-PER")
      elif draw < 0.35:
        words.append(str(rng.randint(0, 9999)))  # Several pieces: the tag sits on the first.
        tags.append("B-NUM")
      else:
        words.append(rng.choice(FILLER))
        tags.append("O")
    rows.append({"text": " ".join(words), "tags": tags})
  return rows


def _qa_rows(n, rng, max_filler=8):
  """A passage of filler words (4 to `max_filler`) holding a person (1-2 words), a number (1-4
  digit pieces) and a color; the question asks for one of them: the answer is a span found
  through the question."""
  rows = []
  for _ in range(n):
    entities = {"person": rng.choice(NAMES) + (f" {rng.choice(SURNAMES)}" if rng.random() < 0.5
                                               else ""),
                "number": str(rng.randint(0, 9999)), "color": rng.choice(COLORS)}
    words = rng.sample(FILLER, rng.randint(4, max_filler))
    for slot, kind in zip(sorted(rng.sample(range(len(words) + 1), 3), reverse=True),
                          rng.sample(list(entities), 3)):
      words.insert(slot, kind)
    context, starts = "", {}
    for word in words:
      context += " " if context else ""
      if word in entities:
        starts[word] = len(context)
        word = entities[word]
      context += word
    kind = rng.choice(list(entities))
    rows.append({"text": QUESTIONS[kind], "text_b": context + ".",
                 "answers": [{"text": entities[kind], "answer_start": starts[kind]}]})
  return rows


def finetune_config(module, tmp_path, task_rows, steps, *, vocab=None, init_from="",
                    model=TASK_MODEL, seq_len=32, learning_rate=2e-3, n_train=320,
                    n_validation=64, seed=0):
  """A fine-tuning config on fresh synthetic files (validation from another seed)."""
  os.makedirs(tmp_path, exist_ok=True)
  train_file = write_jsonl(tmp_path / "train.jsonl", task_rows(n_train, random.Random(seed)))
  dev_file = write_jsonl(tmp_path / "dev.jsonl", task_rows(n_validation, random.Random(99)))
  config = module.get_config()
  config.init_from = init_from
  config.vocab = vocab or ""
  config.model.update(model)
  config.data.update(train_file=train_file, validation_file=dev_file, max_seq_length=seq_len)
  config.train.update(batch_size=32, num_train_steps=steps, learning_rate=learning_rate,
                      warmup_steps=5, log_every_steps=20, eval_every_steps=steps // 2,
                      eval_batch_size=64)
  config.logging.tensorboard = False
  return config


# ------------------------------------------------------------------------------ fixtures


def pretrain_tiny(directory, steps: int = 200) -> tuple[str, str]:
  """A tiny BERT pretrained by the real loop on the animals/objects corpus in `directory`;
  -> (workdir, vocab file). 200 steps: at 150 whether "the [MASK] sat" fills in an animal
  depended on the initialisation's draws (1 of 3 seeds gave "the")."""
  os.makedirs(directory, exist_ok=True)
  vocab_file = _write_vocab(directory / "vocab.txt", ANIMALS + OBJECTS + VERBS + GLUE_WORDS)
  vocab = Vocab.load(vocab_file)
  rng = random.Random(0)

  def sentence():
    return (f"{rng.choice(['the', 'a'])} {rng.choice(ANIMALS)} {rng.choice(VERBS)} "
            f"{rng.choice(['on', 'under', 'near'])} the {rng.choice(OBJECTS)} .")

  documents = [[sentence() for _ in range(rng.randint(4, 8))] for _ in range(400)]
  prepare.prepare_dataset(str(directory / "data"), lambda: iter(documents), vocab,
                          max_seq_length=32, dupe_factor=1, validation_fraction=0.02,
                          num_workers=0)
  config = tiny.get_config()
  config.model.update(vocab_size=vocab.size, **PRETRAIN_MODEL)
  # A tiny templated corpus needs no regularisation, and without dropout the steps reach the
  # same encoder whatever the dropout RNG.
  config.model.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  config.data.update(source="prepared", dataset_dir=str(directory / "data"), max_seq_length=32)
  config.masking.max_predictions_per_seq = 6
  config.train.update(batch_size=32, num_train_steps=steps, learning_rate=3e-3,
                      warmup_steps=20, log_every_steps=50, eval_every_steps=0)
  config.checkpoint.save_every_steps = steps
  config.logging.tensorboard = False
  workdir = str(directory / "run")
  train.train_and_evaluate(config, workdir)
  return workdir, vocab_file


@pytest.fixture(scope="module")
def pretrained_run(tmp_path_factory):
  return pretrain_tiny(tmp_path_factory.mktemp("pretrain"))


def category_config(tmp_path, pretrained_workdir, vocab_file, seed=0, **train_overrides):
  """Animal vs object on held-out words: train on 6 + 6 words, validate on the other 6 + 6."""
  def rows(words):
    return lambda n, rng: [{"text": rng.choice(TEMPLATES).format(w),
                            "label": "animal" if w in ANIMALS else "object"}
                           for w in (rng.choice(words) for _ in range(n))]

  config = finetune_config(
      finetune_classification, tmp_path, rows(ANIMALS[:6] + OBJECTS[:6]), 60,
      init_from=pretrained_workdir, vocab=None if pretrained_workdir else vocab_file,
      model=PRETRAIN_MODEL, seq_len=16, learning_rate=5e-4, n_train=256, seed=seed)
  write_jsonl(config.data.validation_file,
              rows(ANIMALS[6:] + OBJECTS[6:])(128, random.Random(seed + 1)))
  config.train.update(train_overrides)
  return config


# ------------------------------------------------------------------ pretrained encoders


def test_fill_mask_after_pretraining_fits_the_context(pretrained_run):
  workdir = weights.load_pretrained(pretrained_run[0])  # Loaded once for the three calls.
  (animal,), = [[c[0] for c in candidates] for candidates in
                predict.fill_mask(workdir, "the [MASK] sat on the mat .", top_k=1)]
  assert animal in ANIMALS
  thing = predict.fill_mask(workdir, "a dog slept under the [MASK] .", top_k=3)[0]
  assert all(token in OBJECTS for token, _ in thing), thing
  assert all(0 < p < 1 for _, p in thing) and thing[0][1] >= thing[-1][1]
  two = predict.fill_mask(workdir, "the [MASK] lay near the [MASK] .", top_k=2)
  assert len(two) == 2 and two[0][0][0] in ANIMALS and two[1][0][0] in OBJECTS


def test_a_pretraining_workdir_embeds_by_mean_pooling_its_encoder(pretrained_run):
  """The zero-shot baseline of embedding models (`predict.load_embedding_model`, --mode=embed,
  --suite=local_retrieval): a pretraining workdir is an encoder, mean-pooled over [CLS] text
  [SEP] and L2-normalised, not a fine-tuned checkpoint to refuse."""
  workdir, _ = pretrained_run
  model = predict.load_embedding_model(workdir)
  texts = ["the cat sat on the mat .", "a dog slept under the box near the mat ."]
  embeddings = predict.embed(model, texts)
  config, params, vocab = weights.load_pretrained(workdir)
  encoder = model_lib.BertModel(config, add_pooling_layer=False)
  for text, embedding in zip(texts, embeddings):
    ids = np.asarray([[vocab.cls_id, *vocab.encode(text), vocab.sep_id]], np.int32)
    sequence, _ = encoder.apply({"params": params["bert"]}, ids, None, np.ones_like(ids), True)
    mean = np.asarray(sequence[0], np.float64).mean(axis=0)
    np.testing.assert_allclose(embedding, mean / np.linalg.norm(mean), atol=1e-5)


def test_pretrained_encoder_beats_scratch_on_held_out_words(pretrained_run, tmp_path):
  """The median over 3 fine-tuning seeds: one seed of the pretrained encoder gave 0.81 where
  the others gave 1.0 (and the same seed 1.0 on 8 devices: rounding decides such outliers)."""
  workdir, vocab_file = pretrained_run
  accuracy = {}
  for name, init_from, seeds in (("pretrained", workdir, (0, 1, 2)), ("scratch", "", (0,))):
    accuracy[name] = []
    for seed in seeds:
      config = category_config(tmp_path / f"{name}{seed}", init_from, vocab_file, seed=seed)
      result = finetune.finetune_and_evaluate(config, str(tmp_path / f"{name}{seed}" / "run"))
      accuracy[name].append(result["final"]["accuracy"])
  print("held-out-word accuracy (chance 0.5):", accuracy)
  pretrained = float(np.median(accuracy["pretrained"]))
  assert pretrained >= 0.9
  assert pretrained - accuracy["scratch"][0] >= 0.3


def category_tags(words):
  """Tag the one animal / object word of a template sentence by its class (BIO, one word)."""
  def rows(n, rng):
    result = []
    for word in (rng.choice(words) for _ in range(n)):
      text = rng.choice(TEMPLATES).format(word)
      tag = "B-ANIMAL" if word in ANIMALS else "B-OBJECT"
      result.append({"text": text, "tags": [tag if w == word else "O" for w in text.split()]})
    return result
  return rows


def test_frozen_encoder_stays_bitwise_unchanged(pretrained_run, tmp_path):
  """Head-only training on frozen pretrained features: they already separate animals from
  objects, so the tagger transfers to held-out words while the encoder stays bit-identical."""
  model_config, params, vocab = weights.load_pretrained(pretrained_run[0])
  hf_dir = str(tmp_path / "hf")  # The encoder comes in through a HuggingFace export here.
  weights.save_hf(hf_dir, params, model_config, vocab)
  config = finetune_config(finetune_tagging, tmp_path, category_tags(ANIMALS[:6] + OBJECTS[:6]),
                           60, init_from=hf_dir, model=PRETRAIN_MODEL, seq_len=16,
                           learning_rate=1e-2, n_train=256)
  write_jsonl(config.data.validation_file,
              category_tags(ANIMALS[6:] + OBJECTS[6:])(128, random.Random(1)))
  config.train.freeze_encoder = True
  # The features as pretrained (without dropout): config.model's run fields apply to a
  # pretrained encoder, the checkpoint's shape and architecture stay.
  config.model.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  result = finetune.finetune_and_evaluate(config, str(tmp_path / "run"))
  print("frozen-encoder tagging of held-out words:", result["final"])
  # The head learns on frozen features (0.83 with the corpus-wide shuffle's fixture encoder,
  # 0.9+ before; entity F1 of untrained tagging is ~0).
  assert result["freeze_encoder"] and result["final"]["entity_f1"] >= 0.75

  final = jax.device_get(result["state"].params)
  saved = jax.device_get(predict.load_finetuned(str(tmp_path / "run")).params)
  # The run's layout: the real vocabulary rows, then zero rows up to the padded size.
  padded = layout.pad_vocab(params, dataclasses.replace(
      model_config, vocab_pad_multiple=config.model.vocab_pad_multiple))
  expected = {k: v for k, v in padded["bert"].items() if k != "pooler"}  # Tagging: no pooler.
  for trained in (final, saved):
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(
        np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32)), trained["bert"], expected)
    assert np.abs(trained["classifier"]["bias"]).max() > 0  # Initialised at 0, then trained.
  # set_to_zero keeps no optimizer state for the encoder: Adam's moments cover the head only.
  head_size = sum(x.size for x in jax.tree.leaves(final["classifier"]))
  assert sum(x.size for x in jax.tree.leaves(result["state"].opt_state)) < 2 * head_size + 10


# --------------------------------------------------------------------- tasks from scratch


def test_tagging_learns_bio_entities_on_first_pieces(tmp_path):
  vocab = _task_vocab(tmp_path)
  config = finetune_config(finetune_tagging, tmp_path, _tagging_rows, 60, vocab=vocab)
  result = finetune.finetune_and_evaluate(config, str(tmp_path / "run"))
  print("tagging:", result["final"])
  # Chance: 5 tags; always "O" gets no entity at all (entity F1 0).
  assert result["final"]["entity_f1"] >= 0.9 and result["best_metric"] == "entity_f1"
  words = "Grace Lee saw 4096 then Bob went home".split()  # Words of the training data.
  (prediction,) = predict.predict(str(tmp_path / "run"), [{"text": " ".join(words)}])
  assert prediction["words"] == words
  assert prediction["tags"][:4] == ["B-PER", "I-PER", "O", "B-NUM"], prediction


def test_qa_learns_spans_and_maps_them_to_characters(tmp_path):
  """Passages of up to ~22 pieces in rows of 24 (18 for the passage): about a third take two or
  three windows (stride 6), whose windows without the answer learn to point at [CLS]."""
  vocab = _task_vocab(tmp_path)
  rows = lambda n, rng: _qa_rows(n, rng, max_filler=14)
  config = finetune_config(finetune_qa, tmp_path, rows, 200, vocab=vocab, n_train=640,
                           seq_len=24)
  config.data.doc_stride = 6
  result = finetune.finetune_and_evaluate(config, str(tmp_path / "run"))
  print("qa:", result["final"], "train windows:", result["train_rows"])
  assert result["train_rows"] > 700 and result["final"]["windows"] > 70
  assert result["final"]["examples"] == 64  # Scored per question, not per window.
  # Chance: one of ~15 passage words (spans of several pieces make it lower still).
  assert result["final"]["exact_match"] >= 0.6 and result["final"]["f1"] >= 0.6
  # Windows over pieces 0-17, 6-23, 12-24: every answer ends past the first one.
  context = ("we went home with some friends in town at night and then they saw it there today "
             "Carol Jones and 73 red friends.")
  finetuned = predict.load_finetuned(str(tmp_path / "run"))
  records = [{"text": q, "text_b": context} for q in ("who paid?", "what color?", "how many?")]
  encoded = _encode("qa", [("x", 1, r) for r in records], finetuned.vocab,
                                 max_length=24, doc_stride=6, with_labels=False)
  assert [(w.doc_start, w.doc_length) for w in encoded.windows[:3]] == [(0, 18), (6, 18),
                                                                        (12, 13)]
  answers = predict.predict(finetuned, records)
  assert len(answers) == 3
  for answer in answers:
    assert context[answer["start"]:answer["end"]] == answer["answer"]
  assert answers[1]["answer"] == "red", answers


# ------------------------------------------------------------------------------ launchers


def _params_config_vocab(path):
  config, params, vocab = weights.load_pretrained(path)
  return params, config, vocab


def _launch(script, *args):
  """A launcher on one CPU device (what it writes and prints does not depend on the mesh)."""
  env = dict(os.environ, XLA_FLAGS=xla_flags(1),
             JAX_PLATFORMS="cpu")
  return forked_launch.run([sys.executable, os.path.join(ROOT, "launch", script), *args], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=300)


def test_launchers_finetune_then_predict(pretrained_run, tmp_path):
  vocab = _task_vocab(tmp_path)
  rows = _keyword_rows(256, random.Random(0))
  rows.append({"text": " ".join(["we"] * 40 + ["good"]), "label": "pos"})  # Truncated.
  train_file = write_jsonl(tmp_path / "train.jsonl", rows)
  dev_file = write_jsonl(tmp_path / "dev.jsonl", _keyword_rows(64, random.Random(1)))
  workdir = str(tmp_path / "run")
  model = {**{k: v for k, v in TASK_MODEL.items() if "dropout" not in k}, "num_hidden_layers": 1}
  result = _launch(
      "finetune.py", "--config=configs/finetune_classification.py", f"--workdir={workdir}",
      f"--config.vocab={vocab}", f"--config.data.train_file={train_file}",
      f"--config.data.validation_file={dev_file}", "--config.data.max_seq_length=24",
      *[f"--config.model.{k}={v}" for k, v in model.items()],
      "--config.train.num_train_steps=40", "--config.train.learning_rate=2e-3",
      "--config.train.warmup_steps=5", "--config.train.eval_every_steps=20",
      "--config.train.log_every_steps=20", "--config.logging.tensorboard=false")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "1 longer than max_seq_length=24 were truncated" in result.stdout
  assert "Full fine-tuning" in result.stdout
  final = json.load(open(os.path.join(workdir, "final_eval.json")))
  print("keyword classification:", final["final"])
  assert final["final"]["accuracy"] >= 0.9 and final["train_truncated"] == 1  # Chance 0.5.
  records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  assert {r["split"] for r in records} == {"train", "validation"}
  assert [r["step"] for r in records if r["split"] == "validation"] == [20, 40]

  predicted = _launch("predict.py", "--mode=classify", f"--checkpoint={workdir}",
                      "--text=they went home with some awful friends")
  assert predicted.returncode == 0, predicted.stderr[-3000:]
  assert json.loads(predicted.stdout.strip().splitlines()[-1])["label"] == "neg"

  # Expected failures end with one line: predicting from a pretraining workdir, fine-tuning
  # from a missing file.
  wrong = _launch("predict.py", "--mode=classify", f"--checkpoint={pretrained_run[0]}",
                  "--text=x")
  assert wrong.returncode == 1 and "Traceback" not in wrong.stderr
  assert wrong.stderr.strip().splitlines()[-1].startswith("error: ")
  missing = _launch("finetune.py", "--config=configs/finetune_classification.py",
                    f"--workdir={tmp_path / 'missing'}", f"--config.vocab={vocab}",
                    f"--config.data.train_file={tmp_path / 'nope.jsonl'}")
  assert missing.returncode == 1 and "Traceback" not in missing.stderr
  assert missing.stderr.strip().splitlines()[-1] == (
      f"error: Data file {tmp_path / 'nope.jsonl'} does not exist")

  bert_jax_dir = weights.save_pretrained(str(tmp_path / "pretrained"),
                                            *_params_config_vocab(pretrained_run[0]))
  filled = _launch("predict.py", "--mode=fill_mask", f"--checkpoint={bert_jax_dir}",
                   "--text=the [MASK] sat on the mat .", "--top_k=3")
  assert filled.returncode == 0, filled.stderr[-3000:]
  print(filled.stdout)
  lines = filled.stdout.strip().splitlines()
  assert lines[0] == "[MASK] 1:" and len(lines) == 4
  assert lines[1].split()[0] in ANIMALS


# ------------------------------------------------------------------------------ bad input


def test_bad_input_names_the_file_and_line(tmp_path):
  vocab = _task_vocab(tmp_path)
  config = finetune_config(finetune_classification, tmp_path, _keyword_rows, 10, vocab=vocab)
  with open(config.data.train_file, "a") as f:
    f.write("\n" + json.dumps({"text": "we saw it"}) + "\n")  # Line 322 (a blank line before).
  with pytest.raises(ValueError, match=r"train\.jsonl, line 322: missing field 'label'"):
    finetune.finetune_and_evaluate(config, str(tmp_path / "run"))

  records = finetune_data.read_records(write_jsonl(tmp_path / "dev.jsonl", [
      {"text": "we saw it good", "label": "pos"}, {"text": "we bad", "label": "meh"}]))
  with pytest.raises(ValueError, match=r"dev\.jsonl, line 2: label 'meh' is not in the label"):
    _encode("classification", records, Vocab.load(vocab), labels=["neg", "pos"])
  as_config = lambda labels: ml_collections.ConfigDict(
      {"data": {"labels": labels, "regression": False}})
  configured = tasks.ClassificationTask.labels_from(records, as_config((0, 1)))
  with pytest.raises(ValueError, match=r"dev\.jsonl, line 1: label 'pos' is not in"):
    _encode("classification", records, Vocab.load(vocab), labels=configured)
  assert tasks.ClassificationTask.labels_from(records, as_config(())) == ["meh", "pos"]

  csv_file = tmp_path / "tags.csv"
  csv_file.write_text('text,tags\n"Alice went home","B-PER O O"\n"Bob paid 42","B-PER O"\n')
  with pytest.raises(ValueError, match=r"tags\.csv, line 3: 2 tags for 3 words"):
    _encode("tagging", finetune_data.read_records(str(csv_file)), Vocab.load(vocab),
                         labels=["O", "B-PER"])
  qa_file = write_jsonl(tmp_path / "qa.jsonl", [
      {"text": "who paid?", "text_b": "Bob paid.", "answers": [{"text": "Bob",
                                                                "answer_start": 1}]}])
  with pytest.raises(ValueError, match=r"qa\.jsonl, line 1: answer 'Bob' is not at character 1"):
    _encode("qa", finetune_data.read_records(qa_file), Vocab.load(vocab))
  (tmp_path / "broken.jsonl").write_text('{"text": "a", "label": 1}\n{"text": \n')
  with pytest.raises(ValueError, match=r"broken\.jsonl, line 2: not valid JSON"):
    finetune_data.read_records(str(tmp_path / "broken.jsonl"))


def test_best_metric_is_checked_before_training():
  """A best_metric the task never reports was refused only at the first evaluation (#37)."""
  classifier = _task("classification", labels=["neg", "pos"])
  assert classifier.metric_names() == ["accuracy", "f1", "loss"]
  with pytest.raises(ValueError, match=r"^config.train.best_metric='bleu' is not a metric of "
                                       r"task 'classification'; use one of \['accuracy', 'f1', "
                                       r"'loss'\]$"):
    finetune.check_best_metric("bleu", classifier)
  finetune.check_best_metric("", classifier)  # The task's main metric.
  regression = _task("classification", labels=["score"], regression=True)
  assert regression.metric_names() == ["loss", "mse", "pearson"]
  assert "entity_f1" in _task("tagging", labels=["O", "B-PER", "I-PER"]).metric_names()
  assert "entity_f1" not in _task("tagging", labels=["O", "PER"]).metric_names()
  qa = _task("qa")
  v2 = dataclasses.replace(qa, settings=dataclasses.replace(qa.settings,
                                                            version_2_with_negative=True))
  finetune.check_best_metric("HasAns_f1", v2)
  with pytest.raises(ValueError, match="best_metric='HasAns_f1' is not a metric of task 'qa'"):
    finetune.check_best_metric("HasAns_f1", qa)


def test_long_text_is_truncated_and_counted(tmp_path):
  vocab = Vocab.load(_task_vocab(tmp_path))
  records = [("x.jsonl", 1, {"text": "we saw it", "label": "pos"}),
             ("x.jsonl", 2, {"text": "we " * 30 + "good", "label": "pos"})]
  data = _encode("classification", records, vocab, labels=["neg", "pos"],
                              max_length=16)
  assert data.num_truncated == 1 and data.arrays["input_ids"].shape == (2, 16)
  long_tags = [("x", 1, {"text": "Alice " * 20, "tags": ["B-PER"] * 20})]
  tags = _encode("tagging", long_tags, vocab, labels=["O", "B-PER"], max_length=8)
  assert tags.num_truncated == 1 and tags.arrays["label_weights"].sum() == 6
  assert tags.examples[0]["word_positions"][6:] == [-1] * 14
  # A QA passage is never cut: it takes windows (room for 24 - 3 - 3 = 18 of its 43 pieces).
  context = "we saw " * 20 + "Bob paid."
  qa = [("q", 1, {"text": "who paid?", "text_b": context,
                  "answers": [{"text": "Bob", "answer_start": context.index("Bob")}]})]
  for is_training in (True, False):  # Eval rows get the training targets (for its loss).
    windows = _encode("qa", qa, vocab, max_length=24, doc_stride=16,
                                   is_training=is_training)
    assert (windows.num_truncated, windows.num_dropped, windows.num_split) == (0, 0, 1)
    assert len(windows.examples) == 1 and len(windows) == 3
    assert [(w.doc_start, w.doc_length) for w in windows.windows] == [(0, 18), (16, 18), (32, 11)]
    # Only the last window holds "Bob" (piece 40): the others point at [CLS], and all weigh 1.
    np.testing.assert_array_equal(windows.arrays["start_positions"], [0, 0, 5 + 40 - 32])
    np.testing.assert_array_equal(windows.arrays["end_positions"], [0, 0, 5 + 40 - 32])
    np.testing.assert_array_equal(windows.arrays["answer_weight"], [1, 1, 1])
  long_question = [("q", 1, {"text": "who paid? " * 10, "text_b": "Bob paid."})]
  cut = _encode("qa", long_question, vocab, max_length=24, max_query_length=8,
                             with_labels=False)
  assert cut.num_truncated == 1 and cut.windows[0].offset == 10


# --------------------------------------------------------------- tokenization and metrics


def test_regression_labels_loss_and_scores(tmp_path):
  vocab = Vocab.load(_task_vocab(tmp_path))
  csv_file = tmp_path / "scores.csv"
  csv_file.write_text("text,text_b,label\nwe saw it,good,0.5\nwe went home,,-1.25\n")
  data = _encode("classification", finetune_data.read_records(str(csv_file)),
                              vocab, labels=["score"], regression=True)
  np.testing.assert_array_equal(data.arrays["labels"], np.float32([0.5, -1.25]))
  assert data.arrays["token_type_ids"][0].max() == 1 and data.arrays["token_type_ids"][1].max() == 0
  outputs = np.float32([[1.0], [-1.0]])
  task = _task("classification", labels=["score"], regression=True)
  sums = task._sums(outputs, data.arrays)  # pylint: disable=protected-access
  assert float(sums["loss_sum"]) == pytest.approx(0.25 + 0.0625)
  predicted = task.predictions({"logits": outputs}, data)
  assert predicted == [{"score": 1.0}, {"score": -1.0}]
  scores = task.score(predicted, data)
  assert scores["mse"] == pytest.approx((0.25 + 0.0625) / 2) and scores["pearson"] == 1.0
  with pytest.raises(ValueError, match=r"scores\.csv, line 2: regression label 'x'"):
    csv_file.write_text("text,label\nwe saw it,x\n")
    _encode("classification", finetune_data.read_records(str(csv_file)), vocab,
                         labels=["score"], regression=True)
  for cell in ("nan", "inf"):  # Refused before training, not a non-finite loss later (#37).
    csv_file.write_text(f"text,label\nwe saw it,1\nwe went,{cell}\n")
    with pytest.raises(ValueError, match=rf"scores\.csv, line 3: regression label '{cell}' is "
                                         "not a finite number"):
      _encode("classification", finetune_data.read_records(str(csv_file)), vocab,
              labels=["score"], regression=True)



def test_labels_and_offsets_follow_the_pieces(tmp_path):
  vocab = Vocab.load(_task_vocab(tmp_path))
  tagged = _encode("tagging", [("t", 1, {"text": "Bob paid 4096 .",
                                                      "tags": ["B-PER", "O", "B-NUM", "O"]})],
                                vocab, labels=["O", "B-PER", "B-NUM"], max_length=12)
  pieces = [vocab.id_to_piece(i) for i in tagged.arrays["input_ids"][0]]
  assert pieces[:9] == ["[CLS]", "Bob", "paid", "4", "##0", "##9", "##6", ".", "[SEP]"]
  # Labels on each word's first piece only; continuation pieces and specials weigh 0.
  np.testing.assert_array_equal(tagged.arrays["label_weights"][0][:9], [0, 1, 1, 1, 0, 0, 0, 1, 0])
  np.testing.assert_array_equal(tagged.arrays["labels"][0][:8], [0, 1, 0, 2, 0, 0, 0, 0])
  assert tagged.examples[0]["word_positions"] == [1, 2, 3, 7]

  context = "Carol Jones paid 4096, then 7 friends went home."
  records = [("q", 1, {"text": "how many?", "text_b": context,
                       "answers": [{"text": "4096", "answer_start": 17}]})]
  data = _encode("qa", records, vocab, max_length=32)
  start, end = data.arrays["start_positions"][0], data.arrays["end_positions"][0]
  pieces = [vocab.id_to_piece(i) for i in data.arrays["input_ids"][0][start:end + 1]]
  assert pieces == ["4", "##0", "##9", "##6"]
  spans, offset = data.examples[0]["piece_spans"], data.windows[0].offset
  assert context[spans[start - offset][0]:spans[end - offset][1]] == "4096"
  assert data.arrays["context_mask"][0].sum() == np.sum(data.arrays["token_type_ids"][0]) - 1

  # Best span: inside the passage, start <= end, length-capped.
  # Best span: inside the passage (positions 3-7), start <= end, at most max_answer_length.
  start_logits, end_logits = np.zeros(8, np.float32), np.zeros(8, np.float32)
  start_logits[[1, 3, 5]], end_logits[[2, 4, 7]] = [9, 1, 4], [9, 6, 2]
  mask = np.array([0, 0, 0, 1, 1, 1, 1, 1])
  # (1, 2) scores 18 but lies outside the passage; (5, 4) scores 10 but ends before it starts.
  assert qa.best_span(start_logits, end_logits, mask, 30)[:2] == (3, 4)
  assert qa.best_span(start_logits, end_logits, mask, 1)[:2] == (4, 4)


def _run_squad_windows(num_pieces, max_tokens_for_doc, doc_stride):
  """google-research/bert run_squad.py's doc spans and `_check_is_max_context`, transcribed
  loop for loop: the reference the vectorised versions are held to."""
  spans, start_offset = [], 0
  while start_offset < num_pieces:
    length = num_pieces - start_offset
    if length > max_tokens_for_doc:
      length = max_tokens_for_doc
    spans.append((start_offset, length))
    if start_offset + length == num_pieces:
      break
    start_offset += min(length, doc_stride)

  def is_max_context(cur_span_index, position):
    best_score, best_span_index = None, None
    for span_index, (start, length) in enumerate(spans):
      end = start + length - 1
      if position < start or position > end:
        continue
      score = min(position - start, end - position) + 0.01 * length
      if best_score is None or score > best_score:
        best_score, best_span_index = score, span_index
    return cur_span_index == best_span_index

  flags = [[is_max_context(i, start + k) for k in range(length)]
           for i, (start, length) in enumerate(spans)]
  return spans, flags


QA_CONTEXT = "we saw it there today and then they Bob paid home"  # 11 pieces, one per word.


def _qa_records(*rows):
  return [("q.jsonl", line, {"text": question, "text_b": context,
                             "answers": [{"text": answer, "answer_start": context.index(answer)}]})
          for line, (question, context, answer) in enumerate(rows, start=1)]


def test_qa_windows_follow_run_squad(tmp_path):
  """[CLS] who paid ? [SEP] + 6 passage pieces + [SEP] in 12 positions, stride 3, worked by hand:
  windows over pieces 0-5, 3-8, 6-10. Max context, min(left, right) + 0.01 * length: piece 4
  ties 1.06 in windows 0 and 1 (the first wins), piece 7 has 1.06 in window 1 and 1.05 in the
  shorter window 2."""
  vocab = Vocab.load(_task_vocab(tmp_path))
  assert qa.doc_spans(11, 6, 3) == [(0, 6), (3, 6), (6, 5)]
  np.testing.assert_array_equal(qa.max_context_windows([(0, 6), (3, 6), (6, 5)], 11),
                                [0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
  data = _encode("qa", _qa_records(("who paid?", QA_CONTEXT, "Bob paid")), vocab,
                              max_length=12, doc_stride=3, is_training=True)
  assert len(data) == 3 and len(data.examples) == 1 and data.num_split == 1
  windows = data.windows
  assert [(w.example, w.doc_start, w.doc_length, w.offset) for w in windows] == [
      (0, 0, 6, 5), (0, 3, 6, 5), (0, 6, 5, 5)]
  assert [w.max_context.tolist() for w in windows] == [
      [True] * 5 + [False], [False, False, True, True, True, False], [False, False, True, True,
                                                                       True]]
  pieces = [vocab.id_to_piece(i) for i in data.arrays["input_ids"][2]]
  assert pieces == ["[CLS]", "who", "paid", "?", "[SEP]", "then", "they", "Bob", "paid", "home",
                    "[SEP]", "[PAD]"]
  np.testing.assert_array_equal(data.arrays["token_type_ids"][2], [0] * 5 + [1] * 6 + [0])
  np.testing.assert_array_equal(data.arrays["context_mask"][2], [0] * 5 + [1] * 5 + [0] * 2)
  # "Bob paid" is pieces 8-9: whole only in window 2; window 1 holds "Bob" alone, so, as window
  # 0, it points at [CLS] (run_squad's out-of-span rule), with full weight.
  np.testing.assert_array_equal(data.arrays["start_positions"], [0, 0, 7])
  np.testing.assert_array_equal(data.arrays["end_positions"], [0, 0, 8])
  np.testing.assert_array_equal(data.arrays["answer_weight"], [1, 1, 1])

  # The vectorised windows and flags equal run_squad's loops on every small case.
  for num_pieces in range(0, 30):
    for room in range(1, 12):
      for stride in range(1, 14):
        spans, flags = _run_squad_windows(num_pieces, room, stride)
        ours = qa.doc_spans(num_pieces, room, stride)
        assert ours == (spans or [(0, 0)]), (num_pieces, room, stride)
        best = qa.max_context_windows(ours, num_pieces)
        assert [(best[s:s + n] == i).tolist() for i, (s, n) in enumerate(spans)] == flags


def test_qa_head_lets_cls_be_the_out_of_window_target():
  context_mask = np.array([[0, 0, 0, 1, 1, 1, 0, 0]], np.int32)  # [CLS] q [SEP] p p p [SEP] pad
  logits = np.asarray(qa.mask_qa_logits(np.ones((1, 8, 2), np.float32), context_mask))
  np.testing.assert_array_equal(logits[0, [0, 3, 4, 5]], 1.0)  # [CLS] and the passage compete.
  np.testing.assert_array_equal(logits[0, [1, 2, 6, 7]], -1e9)  # Question, [SEP], padding don't.
  batch = {"input_ids": context_mask, "start_positions": np.int32([0]),
           "end_positions": np.int32([0]), "answer_weight": np.float32([1])}
  task = _task("qa")
  sums = task._sums((logits[..., 0], logits[..., 1]), batch)  # pylint: disable=protected-access
  assert float(sums["loss_sum"]) == pytest.approx(np.log(4)) and float(sums["loss_count"]) == 1


def test_qa_decoding_merges_windows_with_max_context(tmp_path):
  vocab = Vocab.load(_task_vocab(tmp_path))
  data = _encode("qa", _qa_records(("who paid?", QA_CONTEXT, "Bob paid")), vocab,
                 max_length=12, doc_stride=3)
  decode = _task("qa", max_length=12, doc_stride=3).predictions
  start = np.full((3, 12), -10.0, np.float32)  # [windows, L]
  end = start.copy()
  # The answer is past the first window: pieces 8-9, at positions 7-8 of window 2.
  start[2, 7], end[2, 8] = 3.0, 3.0
  (answer,) = decode({"start_logits": start, "end_logits": end}, data)
  begin = QA_CONTEXT.index("Bob paid")
  assert answer == {"answer": "Bob paid", "start": begin, "end": begin + 8, "score": 6.0}
  # Window 1 scores "Bob" (piece 8 at its position 10) far higher, but piece 8 has its maximum
  # context in window 2, so a start there only counts in window 2 (run_squad's
  # token_is_max_context); without that rule window 1's span would win.
  start[1, 10], end[1, 10] = 9.0, 9.0
  (answer,) = decode({"start_logits": start, "end_logits": end}, data)
  assert answer["answer"] == "Bob paid" and answer["score"] == 6.0
  assert qa.best_span(start[1], end[1], data.arrays["context_mask"][1], 30) == (
      10, 10, 18.0)
  # Only the start needs its max context: "then they Bob" starts at piece 6 (max context in
  # window 1) and ends at piece 8 (max context in window 2), inside window 1.
  start[1, 8] = 12.0
  (answer,) = decode({"start_logits": start, "end_logits": end}, data)
  assert answer["answer"] == "then they Bob" and answer["score"] == 21.0


class _OracleQA(qa.QATask):
  """A QA task whose "model" points at each window's target: [CLS] in windows without the
  answer."""

  def eval_outputs(self, params, batch):
    del params
    length = batch["input_ids"].shape[1]
    outputs = {"start_logits": jax.nn.one_hot(batch["start_positions"], length) * 10.0,
               "end_logits": jax.nn.one_hot(batch["end_positions"], length) * 10.0}
    weight = batch["example_weight"] * batch["answer_weight"]
    return outputs, {"loss_sum": weight.sum() * 0.0, "loss_count": weight.sum()}


def test_qa_eval_scores_each_question_once_over_its_windows(tmp_path):
  """The trainer's evaluation with an oracle for a model: merged per question the answers are
  exact; scored per window they would not be (those windows' best passage spans are wrong)."""
  vocab = Vocab.load(_task_vocab(tmp_path))
  other = "Carol Jones paid 4096 then 7 red friends went home"
  records = _qa_records(("who paid?", QA_CONTEXT, "Bob paid"), ("how many?", other, "7"),
                        ("what color?", other, "red"), ("who paid?", "Dave paid .", "Dave"))
  config = finetune_qa.get_config()
  config.data.update(max_seq_length=12, doc_stride=3)
  config.train.eval_batch_size = 8
  config.model.update(TASK_MODEL)
  task = _OracleQA(BertConfig(**TASK_MODEL), _task("qa", max_length=12, doc_stride=3).settings)
  data = task.encode(records, vocab)
  assert len(data.examples) == 4 and len(data) == 3 + 4 + 4 + 1
  mesh = sharding.make_mesh(config.mesh)
  outputs, sums = evaluation.evaluate(
      None, programs.make_program(TrainSettings.from_config(config), task, mesh).eval_step,
      finetune_data.eval_batches(data, 8), mesh, config.seed, task.keeps_eval_outputs)
  scores = task.scores(outputs, sums, data)
  assert scores.counts == {"examples": 4, "windows": 12}
  assert scores.metrics["exact_match"] == 1.0 and scores.metrics["f1"] == 1.0
  outputs = task.eval_outputs(None, {**data.arrays, "example_weight": np.ones(len(data))})[0]
  per_window = [qa.best_span(np.asarray(outputs["start_logits"][row]),
                             np.asarray(outputs["end_logits"][row]),
                             data.arrays["context_mask"][row], 30)
                for row in range(len(data))]
  assert sum(score < 20 for _, _, score in per_window) == 6  # Windows without the answer.


def test_sentencepiece_fill_mask_input_and_piece_offsets(tmp_path):
  sentences = [f"the {a} sat on the {o}." for a in ANIMALS for o in OBJECTS]
  vocab = train_sentencepiece(iter(sentences), str(tmp_path / "sp"), 60, "bpe",
                              byte_fallback=False, allow_smaller_vocab=True)
  ids = predict.encode_with_masks(vocab, "the [MASK] sat on the [MASK].")
  assert ids[0] == vocab.cls_id and ids[-1] == vocab.sep_id
  assert ids.count(vocab.mask_id) == 2 and vocab.unk_id not in ids
  assert vocab.decode(ids[1:-1]).split()[:2] == ["the", "[MASK]"]
  word = "rabbit."
  word_ids = vocab.encode(word)
  spans = finetune_data.piece_spans(vocab, word, word_ids)
  assert "".join(word[a:b] for a, b in spans) == word and spans[-1][1] == len(word)


def test_metrics_follow_seqeval_and_squad():
  assert tagging.entities(["B-PER", "I-PER", "O", "I-LOC", "I-LOC", "B-PER", "I-LOC"]) == {
      ("PER", 0, 1), ("LOC", 3, 4), ("PER", 5, 5), ("LOC", 6, 6)}
  gold = [["B-PER", "I-PER", "O", "B-NUM"]]
  scores = tagging.tagging_scores([["B-PER", "O", "O", "B-NUM"]], gold,
                                        ["O", "B-PER", "I-PER", "B-NUM"])
  assert scores["entity_precision"] == 0.5 and scores["entity_recall"] == 0.5
  assert scores["token_accuracy"] == 0.75
  assert qa.normalize_answer("The  Red, car!") == "red car"
  squad = qa.squad_scores(["the red car", "blue"], [["Red car"], ["green", "blue sky"]])
  assert squad["exact_match"] == 0.5 and squad["f1"] == pytest.approx((1 + 2 / 3) / 2)
  binary = classification.classification_scores([1, 1, 0, 0], [1, 0, 0, 0], 2)
  assert binary == {"accuracy": 0.75, "f1": pytest.approx(2 / 3)}
  macro = classification.classification_scores([0, 1, 2, 2], [0, 1, 2, 1], 3)
  assert macro["f1"] == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)


# ------------------------------------------------------------ resume, preemption, accumulation


def _keyword_config(tmp_path, steps=12, **train):
  """Keyword classification from scratch, no dropout anywhere, a checkpoint every 4 steps and
  a loss record every step."""
  os.makedirs(tmp_path, exist_ok=True)
  vocab = _task_vocab(tmp_path)
  config = finetune_config(finetune_classification, tmp_path, _keyword_rows, steps, vocab=vocab,
                           seq_len=16, n_train=96)
  config.model.num_hidden_layers = 1
  config.head.dropout_prob = 0.0
  config.train.update(log_every_steps=1, eval_every_steps=0, **train)
  config.checkpoint.save_every_steps = 4
  return config


def _step_losses(workdir) -> dict[int, float]:
  losses = {}
  for line in open(os.path.join(workdir, "metrics.jsonl")):
    record = json.loads(line)
    if record["split"] == "train":
      losses[record["step"]] = record["loss"]
  return losses


def _config_flags(config) -> list[str]:
  flat = {"init_from": config.init_from, "vocab": config.vocab, "head.dropout_prob": 0.0,
          "checkpoint.save_every_steps": config.checkpoint.save_every_steps,
          "logging.tensorboard": False}
  for section in ("model", "data", "train"):
    for key, value in config[section].items():
      if not isinstance(value, (tuple, list)):
        flat[f"{section}.{key}"] = value
  return [f"--config.{k}={v}" for k, v in flat.items()]


def test_finetuning_resumes_after_sigkill_bit_identically(tmp_path):
  """Launchers on one device throughout (in process, a 1-device mesh of the 8-device process
  rounds differently from a 1-device process)."""
  config = _keyword_config(tmp_path)
  env = dict(os.environ, XLA_FLAGS=xla_flags(1), JAX_PLATFORMS="cpu")

  def launch(workdir, wait=True):
    command = [sys.executable, os.path.join(ROOT, "launch", "finetune.py"),
               "--config=configs/finetune_classification.py", f"--workdir={workdir}",
               *_config_flags(config)]
    if wait:
      done = forked_launch.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
      assert done.returncode == 0, done.stderr[-3000:]
      return None
    return forked_launch.popen(command, cwd=ROOT, env=env)

  reference, workdir = str(tmp_path / "reference"), str(tmp_path / "killed")
  launch(reference)
  process = launch(workdir, wait=False)
  output = ""
  for line in process.stdout:  # Killed hard while logging step 10: after the step-8 save began.
    output += line
    if "step 10/12" in line:
      break
  process.kill()
  process.wait()
  assert "step 10/12" in output, output[-3000:]
  saved = sorted(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit())
  assert saved and saved[-1] in (4, 8), saved
  launch(workdir)
  losses, expected = _step_losses(workdir), _step_losses(reference)
  assert [losses[s] for s in range(1, 13)] == [expected[s] for s in range(1, 13)]
  final = [json.load(open(os.path.join(w, "final_eval.json")))["final"] for w in (workdir,
                                                                                  reference)]
  assert final[0]["accuracy"] == final[1]["accuracy"]


def test_finetuning_sigterm_saves_returns_and_resumes_identically(tmp_path, monkeypatch):
  config = _keyword_config(tmp_path, steps=10)
  config.checkpoint.save_every_steps = 100
  reference = str(tmp_path / "reference")
  finetune.finetune_and_evaluate(config, reference)
  workdir = str(tmp_path / "preempted")
  original = finetune_data.TrainBatches
  monkeypatch.setattr(finetune_data, "TrainBatches",
                      lambda *args: SigtermAt(original(*args), at=4))
  stopped = finetune.finetune_and_evaluate(config, workdir)
  monkeypatch.setattr(finetune_data, "TrainBatches", original)
  at = stopped["preempted_at"]
  assert 1 <= at < 10  # Stopped at the step under way when the signal came (prefetch ahead).
  assert os.listdir(os.path.join(workdir, "checkpoints")) == [str(at)]
  finetune.finetune_and_evaluate(config, workdir)
  losses, expected = _step_losses(workdir), _step_losses(reference)
  assert [losses[s] for s in range(1, 11)] == [expected[s] for s in range(1, 11)]


def test_finetuning_gradient_accumulation_equals_the_full_batch(tmp_path):
  full = finetune.finetune_and_evaluate(_keyword_config(tmp_path / "full", steps=3),
                                        str(tmp_path / "full" / "run"))
  accumulated = finetune.finetune_and_evaluate(
      _keyword_config(tmp_path / "accumulated", steps=3, grad_accum_steps=4),
      str(tmp_path / "accumulated" / "run"))
  np.testing.assert_allclose(
      [_step_losses(str(tmp_path / "accumulated" / "run"))[s] for s in (1, 2, 3)],
      [_step_losses(str(tmp_path / "full" / "run"))[s] for s in (1, 2, 3)], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               jax.device_get(accumulated["state"].params),
               jax.device_get(full["state"].params))


def test_finetuning_refuses_other_labels_or_head_and_stops_on_a_read_only_best_export(tmp_path):
  config = _keyword_config(tmp_path, steps=4)
  workdir = str(tmp_path / "run")
  finetune.finetune_and_evaluate(config, workdir)
  labels = json.load(open(os.path.join(workdir, "final_eval.json")))["labels"]
  config.train.num_train_steps = 8
  config.data.labels = tuple(reversed(labels))  # Same count, other order: other classifier rows.
  with pytest.raises(ValueError, match=r"was trained with the labels \['neg', 'pos'\], this run "
                     r"has \['pos', 'neg'\]"):
    finetune.finetune_and_evaluate(config, workdir)
  config.data.labels, config.head.kind = tuple(labels), "modernbert"  # Other head params.
  with pytest.raises(ValueError, match=r"was trained with bert's task head, this run builds "
                     r"modernbert's: set --config.head.kind=bert to resume it"):
    finetune.finetune_and_evaluate(config, workdir)

  from tests.test_train_e2e import _bind_read_only  # pylint: disable=import-outside-toplevel
  fresh = str(tmp_path / "read_only_best")
  best = os.path.join(fresh, "best")
  if not _bind_read_only(best):
    pytest.fail("this test needs `mount --bind` (root), as the CI machine has")
  try:  # The launcher, as an operator meets it: one line, exit 1, within seconds of the export.
    second = _keyword_config(tmp_path / "second", steps=4)
    second.train.eval_every_steps = 2
    process = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "launch", "finetune.py"),
         "--config=configs/finetune_classification.py", f"--workdir={fresh}",
         *_config_flags(second)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=dict(os.environ, XLA_FLAGS=xla_flags(8),
                            JAX_PLATFORMS="cpu"))
    output = ""
    for line in process.stdout:  # The export of step 2 follows its evaluation.
      output += line
      if "step 2/4" in line:
        break
    at_export = time.time()
    rest, errors = process.communicate(timeout=120)
    after_export = time.time() - at_export
  finally:
    subprocess.run(["umount", "-l", best], check=False)
  assert process.returncode == 1, output + rest + errors
  assert after_export < 30, after_export
  lines = [l for l in errors.splitlines() if l.strip()]
  assert lines[-1].startswith(f"error: Could not write the best params (step 2) in {best}: "
                              "Read-only file system"), errors[-2000:]
  assert "Traceback" not in output + rest + errors


def test_a_pretrained_encoder_takes_the_run_fields_of_config_model(tmp_path):
  """The checkpoint fixes shape and architecture; every run field (dtypes, dropout, kernels,
  remat, padding, pooling when set, init scheme) comes from this run's config.model."""
  from tests.test_convert_predict_guards import TINY, _hf_dir  # pylint: disable=import-outside-toplevel
  config = finetune_classification.get_config()
  config.init_from = _hf_dir(tmp_path)
  run_fields = {"dtype": "bfloat16", "hidden_dropout_prob": 0.0,
                "attention_probs_dropout_prob": 0.3, "attention_impl": "einsum", "remat": "full",
                "vocab_pad_multiple": 8, "dropout_rng": "threefry", "classifier_pooling": "mean",
                "splash_block_q": 256, "splash_block_kv": 128, "initializer": "modernbert",
                "scan_unroll": 2}
  config.model.update(**run_fields, hidden_size=999, num_hidden_layers=7)  # Shape: ignored.
  assert set(run_fields) | {"param_dtype", "initializer_range"} == set(
      BertConfig.fields_of(model_lib.RUN))
  encoder = finetune.load_encoder(config)
  assert {name: getattr(encoder.config, name) for name in run_fields} == run_fields
  assert (encoder.config.hidden_size, encoder.config.num_hidden_layers) == (
      TINY.hidden_size, TINY.num_hidden_layers)


@pytest.mark.parametrize("examples,batch,epochs,expected", [
    (3668, 32, 3.0, (343, 34)),  # MRPC with run_classifier.py's defaults.
    (2490, 32, 3.0, (233, 23)),  # RTE.
    (392702, 32, 3.0, (36815, 3681)),  # MNLI.
    (87599, 12, 2.0, (14599, 1459)),  # SQuAD v1.1 with run_squad.py's README settings.
])
def test_epochs_and_warmup_proportion_give_the_original_step_counts(examples, batch, epochs,
                                                                     expected):
  config = finetune_classification.get_config()
  config.train.update(batch_size=batch, num_train_epochs=epochs)
  # run_classifier.py: int(len(train_examples) / train_batch_size * num_train_epochs) steps,
  # int(num_train_steps * warmup_proportion) of warmup.
  assert finetune.train_length(config.train, examples) == expected
  config.train.num_train_steps = 1000  # An explicit length wins; warmup stays a proportion.
  assert finetune.train_length(config.train, examples) == (1000, 100)
  config.train.warmup_steps = 7  # So does an explicit warmup.
  assert finetune.train_length(config.train, examples) == (1000, 7)
  config.train.update(num_train_steps=0, num_train_epochs=1e12)  # JAX's OverflowError (#37).
  with pytest.raises(ValueError, match=r"num_train_epochs=1e\+12 .* steps, more than the "
                                       r"2147483647 a run can count$"):
    finetune.train_length(config.train, examples)


def test_a_run_from_the_default_length_trains_its_epochs_and_says_so(tmp_path, capsys):
  config = _keyword_config(tmp_path, steps=0)  # 96 examples at batch 32.
  config.train.update(num_train_epochs=1.0, warmup_steps=0, warmup_proportion=0.5)
  result = finetune.finetune_and_evaluate(config, str(tmp_path / "run"))
  assert "Training 3 steps (1 epochs of 96 examples at batch 32), warmup 1" in capsys.readouterr().out
  assert max(_step_losses(str(tmp_path / "run"))) == 3 == int(result["state"].step)
  config.train.num_train_epochs = 0.1  # 9.6 examples: less than a step.
  with pytest.raises(ValueError, match=r"config.train.num_train_epochs=0.1 of 96 training "
                                       r"examples at config.train.batch_size=32 is less than one"):
    finetune.finetune_and_evaluate(config, str(tmp_path / "short"))
