"""Nothing hangs and nothing is lost in convert and predict: an output directory that is, holds
or lies inside an input is refused before anything is read or written; config sizes that are
not whole numbers >= 1 name the file and field; a damaged TF index never asks for a huge
allocation; fill-mask never proposes special tokens and caps top_k; predict says what it cuts;
usage errors are one line with exit status 2.

Every model here is tiny and random (shapes from the model itself, values from numpy): nothing
is trained. The launchers of a test run side by side (`_launch_all`), as each spends most of
its seconds importing.
"""

import dataclasses
import json
import os
import subprocess
import sys
import tracemalloc

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_jax import predict, tasks, weights
from bert_jax.checkpoints import checkpointing
from bert_jax.models import model as model_lib
from bert_jax.weights import hf_bert
from bert_jax.data.vocab import Vocab
from bert_jax.models import model as model_lib
from bert_jax.models.model import BertConfig
from bert_jax.weights import files, tf_bundle
from bert_jax.weights import params as params_lib
from tests import forked_launch, tf_bundle_writer
from tests.test_finetune import ROOT, SPECIALS, _write_vocab
from tests.suite_flags import xla_flags

WORDS = ["the", "cat", "dog", "sat", "on", "mat", "a", "good", "bad", "film", "very", "long"]
# Specials first ([PAD]=0 ... [MASK]=4), then the words and test_finetune's digit pieces.
TOKENS = SPECIALS + sorted(WORDS) + [str(d) for d in range(10)] + ["##" + str(d)
                                                                    for d in range(10)]
TINY = BertConfig(vocab_size=len(TOKENS), hidden_size=16, num_hidden_layers=1,
                  num_attention_heads=2, intermediate_size=32, max_position_embeddings=32)


def _random_tree(shapes, seed: int = 0) -> dict:
  """Random float32 arrays in the shapes of an abstract (eval_shape) params tree."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: (0.1 * rng.normal(size=x.shape)).astype(np.float32),
                      nn.meta.unbox(shapes))


def _tiny_params(config: BertConfig = TINY) -> dict:
  """BertForPreTraining params (every head) of `config`, random."""
  shapes = model_lib.param_shapes(config)
  return _random_tree(params_lib.unflatten(
      {path: jax.ShapeDtypeStruct(shape, np.float32) for path, shape in shapes.items()}))


def _vocab(directory) -> Vocab:
  os.makedirs(directory, exist_ok=True)
  return Vocab.load(_write_vocab(os.path.join(directory, "vocab.txt"), WORDS))


def _hf_dir(tmp_path, name: str = "hf") -> str:
  """A HuggingFace directory (config.json, model.safetensors, vocab.txt) of a random model."""
  vocab = _vocab(tmp_path / f"{name}_vocab")
  assert vocab.size == TINY.vocab_size
  directory = str(tmp_path / name)
  weights.save_hf(directory, _tiny_params(), TINY, vocab)
  return directory


def _tf_dir(directory, config: dict | None = None) -> str:
  """A TF checkpoint directory: a one-tensor bundle (what is refused here is refused before
  its tensors are read), bert_config.json and vocab.txt."""
  os.makedirs(directory)
  tf_bundle_writer.write_bundle(os.path.join(directory, "bert_model.ckpt"),
                                {"bert/embeddings/word_embeddings": np.ones((4, 2), np.float32)})
  with open(os.path.join(directory, "bert_config.json"), "w") as f:
    json.dump(config or params_lib.config_dict(TINY), f)
  _write_vocab(os.path.join(directory, "vocab.txt"), WORDS)
  return os.path.join(directory, "bert_model.ckpt")


def _finetune_task(name: str, **values) -> tasks.FinetuneTask:
  """Task `name` on TINY with the fields of its settings class taken from `values`."""
  task_class = tasks.finetune_task(name)
  fields = {f.name for f in dataclasses.fields(task_class.settings_class)}
  return task_class(TINY, task_class.settings_class(**{k: v for k, v in values.items()
                                                       if k in fields}))


def _classifier_workdir(tmp_path, max_seq_length: int = 16) -> str:
  """A fine-tuning workdir's best export (random classifier), as launch/finetune.py leaves it."""
  task = _finetune_task("classification", labels=("neg", "pos"), regression=False,
                        max_seq_length=max_seq_length, head_dropout_prob=0.0,
                        freeze_encoder=False)
  params = _random_tree(jax.eval_shape(
      lambda: task.model.init(jax.random.key(0), *task.example_inputs())["params"]))
  workdir = str(tmp_path / "classifier")
  export = checkpointing.BestExport(workdir)
  export.save(3, params, {"model_config": checkpointing.to_json(dataclasses.asdict(TINY)),
                          "task": task.meta()}, _vocab(tmp_path / "cls_vocab"))
  export.close()
  return workdir


def _snapshot(directory) -> dict[str, bytes]:
  """Every file under `directory` with its bytes, to show that nothing was touched."""
  found = {}
  for root, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        found[os.path.relpath(path, directory)] = f.read()
  return found


def _launch_all(runs: dict[str, list[str]]) -> dict[str, subprocess.CompletedProcess]:
  """Launchers, one after another: name -> [script, *args] -> name -> finished process, on one
  CPU device each (as test_finetune._launch), forked (`tests/forked_launch.py`)."""
  env = dict(os.environ, XLA_FLAGS=xla_flags(1), JAX_PLATFORMS="cpu")
  return {name: forked_launch.run([sys.executable, os.path.join(ROOT, "launch", script), *args],
                                  cwd=ROOT, env=env, timeout=240)
          for name, (script, *args) in runs.items()}


def _error_line(result: subprocess.CompletedProcess, status: int) -> str:
  """The one `error:` line of a failed launch (exit `status`, no traceback) -> its text."""
  assert result.returncode == status, (result.returncode, result.stderr[-3000:])
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("error: "), result.stderr[-3000:]
  return last


# ------------------------------------------------------------------ output apart from inputs


def test_output_apart_from_inputs_compares_resolved_paths(tmp_path):
  tmp_path = tmp_path.resolve()  # The messages below show a path's resolution when it differs.
  model = tmp_path / "runs" / "model"
  model.mkdir(parents=True)
  (model / "config.json").write_text("{}")
  os.symlink(model, tmp_path / "link")

  def refused(output, inputs, relation):
    with pytest.raises(ValueError) as error:
      files.check_apart(str(output), inputs, "--output_dir")
    message = str(error.value)
    assert f" {relation} " in message and message.startswith("--output_dir "), message
    return message

  message = refused(model, {"the --from_hf directory": str(model)}, "is")
  assert message.count(str(model)) == 2  # Both paths named.
  refused(tmp_path / "runs", {"input": str(model)}, "holds")
  refused(model / "converted", {"input": str(model)}, "lies inside")
  refused(tmp_path / "runs" / "x" / ".." / "model", {"input": str(model)}, "is")
  message = refused(tmp_path / "link", {"input": str(model)}, "is")
  assert f"{tmp_path / 'link'} (= {model})" in message  # What the symlink resolves to.
  refused(tmp_path / "link" / "out", {"input": str(model)}, "lies inside")
  refused(tmp_path / "runs", {"--vocab": str(model / "config.json")}, "holds")
  # Apart: a sibling sharing a name prefix, a file's sibling, other places; empty inputs.
  for output in (tmp_path / "runs" / "model2", tmp_path / "runs" / "model.out", tmp_path / "o"):
    files.check_apart(str(output), {"input": str(model), "--vocab": "", "--bert_config": None})
  files.check_apart(str(model), {"a bucket": "gs://bucket/runs/model"})

  # Buckets: normalised URLs, the same rules.
  refused("gs://bucket/runs/model/", {"input": "gs://bucket/runs/model"}, "is")
  refused("gs://bucket//runs/./model", {"input": "gs://bucket/runs/model/"}, "is")
  refused("gs://bucket/runs", {"input": "gs://bucket/runs/model"}, "holds")
  refused("gs://bucket/runs/model/hf", {"input": "gs://bucket/runs/model"}, "lies inside")
  refused("gcs://bucket/runs/model", {"input": "gs://bucket/runs/model"}, "is")
  for output in ("gs://bucket/runs/model2", "gs://other/runs/model", str(tmp_path / "gs:")):
    files.check_apart(output, {"input": "gs://bucket/runs/model"})


def test_convert_refuses_an_output_that_is_holds_or_lies_in_an_input(tmp_path):
  tmp_path = tmp_path.resolve()  # The messages below show a path's resolution when it differs.
  hf = tmp_path / "hf"
  hf.mkdir()
  for name, text in (("config.json", "{}"), ("model.safetensors", "weights"),
                     ("vocab.txt", "[PAD]\n")):
    (hf / name).write_text(text)
  workdir = tmp_path / "runs" / "tiny"  # A training run (never read: refused before).
  (workdir / "checkpoints" / "100").mkdir(parents=True)
  (workdir / "checkpoints" / "100" / "state").write_text("the run")
  (workdir / "train.log").write_text("log")
  prefix = _tf_dir(tmp_path / "tf")
  shared = tmp_path / "shared"
  shared.mkdir()
  vocab = _write_vocab(shared / "vocab.txt", WORDS)
  os.symlink(tmp_path / "tf", tmp_path / "tf_link")
  before = {path: _snapshot(path) for path in (hf, workdir, tmp_path / "tf", shared)}

  results = _launch_all({
      "hf_is": ["convert.py", f"--from_hf={hf}", f"--output_dir={hf}", "--overwrite"],
      "workdir_parent": ["convert.py", f"--from_bert_jax={workdir}",
                         f"--to_hf={tmp_path / 'runs'}", "--overwrite"],
      "tf_symlinked_dir": ["convert.py", f"--from_tf={prefix}",
                           f"--output_dir={tmp_path / 'tf_link'}", "--overwrite"],
      "tf_vocab_dir": ["convert.py", f"--from_tf={tmp_path / 'tf'}", f"--vocab={vocab}",
                       f"--output_dir={shared}", "--overwrite"],
      "no_mode": ["convert.py", f"--output_dir={tmp_path / 'out'}"],
      "positional": ["convert.py", f"--from_hf={hf}", f"--output_dir={tmp_path / 'out'}",
                     "extra"],
      "encoder_only": ["convert.py", f"--from_hf={hf}", f"--output_dir={tmp_path / 'out'}",
                       "--encoder_only"],
  })
  expected = {
      "hf_is": f"{hf} is the --from_hf directory {hf}",
      "workdir_parent": f"--to_hf {tmp_path / 'runs'} holds --from_bert_jax {workdir}",
      "tf_symlinked_dir": f"--output_dir {tmp_path / 'tf_link'} (= {tmp_path / 'tf'}) holds "
                          f"--from_tf {prefix}",
      "tf_vocab_dir": f"--output_dir {shared} holds --vocab {vocab}",
  }
  for name, text in expected.items():
    assert text in _error_line(results[name], 1), name
  for name in ("no_mode", "positional", "encoder_only"):  # Usage errors: one line, no usage.
    assert _error_line(results[name], 2) == results[name].stderr.strip(), name
  assert "Give exactly one of --from_hf" in results["no_mode"].stderr
  assert "unexpected arguments: ['extra']" in results["positional"].stderr
  assert "--encoder_only is for --from_bert_jax" in results["encoder_only"].stderr
  for path, files_before in before.items():
    assert _snapshot(path) == files_before, path  # The inputs are intact.
  assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------- config fields


@pytest.mark.parametrize("field,value,expected", [
    ("vocab_size", None, "vocab_size is null"),
    ("hidden_size", 768.5, "hidden_size is 768.5"),
    ("intermediate_size", "32", 'intermediate_size is "32"'),
    ("num_hidden_layers", True, "num_hidden_layers is true"),
    ("num_attention_heads", 0, "num_attention_heads is 0"),
    ("max_position_embeddings", -512, "max_position_embeddings is -512"),
    ("type_vocab_size", [2], "type_vocab_size is \\[2\\]"),
    ("vocab_size", 2**31, "vocab_size is 2147483648; it must be a whole number in \\[1, "
                          "2147483647\\]"),
    ("num_attention_heads", 3, "hidden_size=16 is not divisible by num_attention_heads=3"),
    ("hidden_dropout_prob", 1.5, "hidden_dropout_prob is 1.5; it must be a number in"),
])
def test_config_fields_name_the_file_and_field(tmp_path, field, value, expected):
  directory = tmp_path / "hf"
  directory.mkdir()
  values = {**params_lib.config_dict(TINY), "model_type": "bert", field: value}
  (directory / "config.json").write_text(json.dumps(values))
  with pytest.raises(ValueError, match=rf"hf/config\.json: {expected}"):
    weights.load_hf(str(directory))
  prefix = _tf_dir(tmp_path / "tf", {**params_lib.config_dict(TINY), field: value})
  with pytest.raises(ValueError, match=rf"tf/bert_config\.json: {expected}"):
    weights.load_tf(prefix)


def test_config_accepts_integral_floats_and_refuses_a_billion_layers_quickly(tmp_path):
  source = _hf_dir(tmp_path)
  config_file = os.path.join(source, "config.json")
  values = json.load(open(config_file))
  json.dump({**values, "hidden_size": 16.0, "num_hidden_layers": 1.0}, open(config_file, "w"))
  config, _, _ = weights.load_hf(source)
  assert config == TINY and isinstance(config.hidden_size, int)
  json.dump({**values, "num_hidden_layers": 10**9}, open(config_file, "w"))
  with pytest.raises(ValueError, match=r"config\.json\): Missing key in the checkpoint: "
                     r"bert\.encoder\.layer\.1\.\* \(the config says num_hidden_layers="):
    weights.load_hf(source)
  json.dump([values], open(config_file, "w"))
  with pytest.raises(ValueError, match=r"config\.json holds a JSON list, not an object"):
    weights.load_hf(source)
  # A bert_jax tree checked against a config with more layers than it has: refused first.
  with pytest.raises(ValueError, match=r"src: the params have 1 encoder layers, the config says "
                     r"num_hidden_layers=1000000000"):
    params_lib.check_params(_tiny_params(), dataclasses.replace(TINY, num_hidden_layers=10**9),
                            "src")


# ---------------------------------------------------------------------- TF bundle entries


def test_tf_bundle_refuses_absurd_entries_without_allocating(tmp_path):
  tensors = {"bert/a": np.arange(12, dtype=np.float32).reshape(4, 3),
             "bert/b": np.ones((5,), np.float32)}
  huge = (100_000, 100_000)
  cases = {
      "shape_only": ({"shape": huge}, r"bert/a records 48 bytes for shape \(100000, 100000\)"),
      "shape_and_size": ({"shape": huge, "size": 4 * 10**10},
                         r"is truncated, or .*case\.ckpt\.index damaged: bert/a \(shape "
                         r"\(100000, 100000\) of float32\) needs bytes 0\.\.40000000000, the "
                         r"file has 68"),
      "negative": ({"shape": (-1, 12)}, r"bert/a has shape \(-1, 12\), with a negative"),
      "offset": ({"offset": 10**15}, r"bert/a .* needs bytes 1000000000000000\.\."),
      "shard": ({"shard_id": 3}, r"bert/a is in data shard 3, the checkpoint has 1"),
  }
  for name, (tamper, message) in cases.items():
    prefix = str(tmp_path / name / "case.ckpt")
    tf_bundle_writer.write_bundle(prefix, tensors, tamper={"bert/a": tamper})
    with tf_bundle.BundleReader(prefix) as reader:
      np.testing.assert_array_equal(reader.read("bert/b"), tensors["bert/b"])  # Undamaged.
      tracemalloc.start()
      try:
        with pytest.raises(ValueError, match=message):
          reader.read("bert/a")
        peak = tracemalloc.get_traced_memory()[1]
      finally:
        tracemalloc.stop()
    assert peak < 1 << 20, (name, peak)
  # Through the importer, the error names the index.
  prefix = str(tmp_path / "model" / "bert_model.ckpt")
  tf_bundle_writer.write_bundle(prefix, {"bert/embeddings/word_embeddings": tensors["bert/a"]},
                                tamper={"bert/embeddings/word_embeddings": {"shape": huge}})
  with open(tmp_path / "model" / "bert_config.json", "w") as f:
    json.dump(params_lib.config_dict(TINY), f)
  _write_vocab(tmp_path / "model" / "vocab.txt", WORDS)
  with pytest.raises(ValueError, match=r"model/bert_model\.ckpt\.index: bert/embeddings/word_"
                     r"embeddings records 48 bytes for shape \(100000, 100000\)"):
    weights.load_tf(prefix)


# ------------------------------------------------------------------------------- predict


def test_fill_mask_never_proposes_special_tokens_and_caps_top_k(tmp_path):
  params = _tiny_params()
  vocab = _vocab(tmp_path)
  # The MLM bias favours every special token by far: still none is proposed.
  params["mlm"]["bias"][list(vocab.special_ids)] = 50.0
  proposable = vocab.size - len(SPECIALS)
  results = predict.fill_mask((TINY, params, vocab), "the [MASK] sat on the [MASK]",
                              top_k=proposable)
  assert len(results) == 2
  for candidates in results:
    tokens = [token for token, _ in candidates]
    assert len(tokens) == proposable and not set(tokens) & set(SPECIALS)
    probabilities = [p for _, p in candidates]
    assert all(0 < p < 0.01 for p in probabilities)  # The specials hold the rest.
    assert probabilities == sorted(probabilities, reverse=True)
  with pytest.raises(ValueError, match=rf"top_k={proposable + 1} is more than the {proposable} "
                     rf"tokens .* the maximum is {proposable}"):
    predict.fill_mask((TINY, params, vocab), "[MASK]", top_k=proposable + 1)
  for bad in (0, -3):
    with pytest.raises(ValueError, match=rf"top_k={bad}: it must be an integer >= 1"):
      predict.fill_mask((TINY, params, vocab), "[MASK]", top_k=bad)


def test_fill_mask_of_an_mlm_only_checkpoint_warns_of_nothing(tmp_path, caplog):
  """fill_mask reads the MLM head only: a checkpoint without NSP head (objective "mlm", the
  modern encoder) printed Python's raw UserWarning about it on the console (#37); the launchers
  turn any other warning into one log line."""
  import warnings  # pylint: disable=import-outside-toplevel
  from bert_jax.runtime import cli  # pylint: disable=import-outside-toplevel
  vocab = _vocab(tmp_path / "vocab")
  directory = str(tmp_path / "mlm_only")
  weights.save_hf(directory, {k: v for k, v in _tiny_params().items() if k != "nsp"}, TINY, vocab)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert len(predict.fill_mask(directory, "the [MASK] sat", top_k=2)[0]) == 2
  assert not caught, [str(w.message) for w in caught]
  with caplog.at_level("WARNING"):
    show = cli._show_warning  # pylint: disable=protected-access
    show(UserWarning("a thing to know"), UserWarning, "x.py", 3)
  assert [r.getMessage() for r in caplog.records] == ["UserWarning: a thing to know"]


def test_truncation_notes_say_what_the_model_does_not_read(tmp_path):
  vocab = _vocab(tmp_path)

  def notes(name, records, labels=("O", "B-X"), **settings):
    values = dict(labels=labels, regression=False, max_seq_length=8, max_query_length=4,
                  doc_stride=4, max_answer_length=4, head_dropout_prob=0.0,
                  freeze_encoder=False)
    task = _finetune_task(name, **{**values, **settings})
    return predict.truncation_notes(predict.Finetuned(task, None, vocab, {}, 0), records)

  short, long = "a good film", "the cat sat on the mat a very long film"  # 3 and 10 pieces.
  records = [("--text", 1, {"text": long}), {"text": short}, {"text": long, "text_b": short}]
  assert notes("classification", records) == [
      "--text: the text has 12 pieces with [CLS] and [SEP]; the model reads the first 8 "
      "(max_seq_length)",
      "<input>, line 3: the pair has 16 pieces with [CLS] and [SEP]; the longer of text and "
      "text_b is cut first, to 8 (max_seq_length)"]
  assert notes("tagging", records[:2]) == [
      "--text: the text has 12 pieces with [CLS] and [SEP]; the model reads the first 8 "
      "(max_seq_length); the words past them are tagged O"]
  assert notes("qa", [{"text": long, "text_b": short}, {"text": short, "text_b": long}]) == [
      "<input>, line 1: the question has 10 pieces; the model reads the first 4 "
      "(max_query_length)"]
  many = notes("classification", [{"text": long}] * 13)
  assert len(many) == 11 and many[-1] == "... and 3 more inputs cut the same way"
  with pytest.raises(ValueError, match="batch_size=0: it must be an integer >= 1"):
    predict.predict(predict.Finetuned(None, None, vocab, {}, 0), [{"text": short}], 0)
  with pytest.raises(ValueError, match="No input records"):
    predict.predict(predict.Finetuned(None, None, vocab, {}, 0), [], 4)


def test_predict_launcher_notes_truncation_and_refuses_bad_flags(tmp_path):
  hf = _hf_dir(tmp_path)
  workdir = _classifier_workdir(tmp_path, max_seq_length=16)
  empty = tmp_path / "empty.jsonl"
  empty.write_text("\n")
  text = " ".join(["very"] * 20 + ["good", "film"])  # 22 pieces + [CLS] + [SEP].
  fill = ["predict.py", "--mode=fill_mask", f"--checkpoint={hf}"]
  classify = ["predict.py", "--mode=classify", f"--checkpoint={workdir}"]
  generate = ["predict.py", "--mode=generate", f"--checkpoint={hf}"]
  results = _launch_all({
      "long_text": [*classify, f"--text={text}"],
      "top_k_too_large": [*fill, "--text=the [MASK] sat", "--top_k=1000"],
      "top_k_zero": [*fill, "--text=the [MASK] sat", "--top_k=0"],
      "no_text": fill,
      "blank_text": [*fill, "--text=   "],
      "top_k_for_classify": [*classify, "--text=good", "--top_k=3"],
      "batch_size_zero": [*classify, "--text=good", "--batch_size=0"],
      "unknown_mode": ["predict.py", "--mode=summarize", f"--checkpoint={hf}", "--text=x"],
      "empty_file": [*classify, f"--input_file={empty}"],
      # Masked diffusion's sampler (#41): any checkpoint with an MLM head.
      "generate": [*generate, "--length=5", "--steps=3", "--prompt=the cat", "--seed=3",
                   "--num_samples=2", "--top_k=4", "--top_p=0.9"],
      "generate_steps_zero": [*generate, "--steps=0"],
      "generate_too_long": [*generate, f"--length={TINY.max_position_embeddings}"],
      "generate_blank_prompt": [*generate, "--prompt=  "],
      "generate_no_mlm_head": ["predict.py", "--mode=generate", f"--checkpoint={workdir}"],
      "generate_with_text": [*generate, "--text=the cat"],
  })
  long_text = results["long_text"]
  assert long_text.returncode == 0, long_text.stderr[-3000:]
  assert ("note: --text: the text has 24 pieces with [CLS] and [SEP]; the model reads the "
          "first 16 (max_seq_length)") in long_text.stderr.splitlines()
  assert set(json.loads(long_text.stdout.strip().splitlines()[-1])["probabilities"]) == {
      "neg", "pos"}
  assert "the maximum is 32" in _error_line(results["top_k_too_large"], 1)  # 37 - 5 specials.
  assert "--top_k=0" in _error_line(results["top_k_zero"], 2)
  assert "--mode=fill_mask needs --text" in _error_line(results["no_text"], 2)
  assert "--text is empty" in _error_line(results["blank_text"], 2)
  assert "--top_k: not used by --mode=classify" in _error_line(results["top_k_for_classify"], 2)
  assert "--batch_size=0" in _error_line(results["batch_size_zero"], 2)
  assert "summarize" in _error_line(results["unknown_mode"], 2)
  assert f"{empty} holds no records" in _error_line(results["empty_file"], 1)
  generated = results["generate"]
  assert generated.returncode == 0, generated.stderr[-3000:]
  samples = [json.loads(line) for line in generated.stdout.strip().splitlines()]
  assert [s["prompt"] for s in samples] == ["the cat"] * 2
  assert all(len(s["ids"]) == 5 and not set(s["ids"]) & set(range(len(SPECIALS)))
             for s in samples)
  assert "--steps=0" in _error_line(results["generate_steps_zero"], 2)
  assert (f"special tokens is {TINY.max_position_embeddings + 2} positions" in
          _error_line(results["generate_too_long"], 1))
  assert "--prompt is empty" in _error_line(results["generate_blank_prompt"], 2)
  assert "has no MLM head" in _error_line(results["generate_no_mlm_head"], 1)
  assert "--text: not used by --mode=generate" in _error_line(results["generate_with_text"], 2)
  for name, result in results.items():
    if result.returncode == 2:  # A usage error is one line: no usage page.
      assert len(result.stderr.strip().splitlines()) == 1, (name, result.stderr)


def test_a_pretraining_workdir_given_for_a_fine_tuned_one_says_what_it_is(monkeypatch):
  """The red team: --mode=classify on a pretraining workdir said "not a fine-tuned checkpoint of
  this bert_jax version" and printed the whole masking config."""
  from bert_jax import predict  # pylint: disable=import-outside-toplevel
  from bert_jax.checkpoints import checkpointing  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(checkpointing, "find_step_dir", lambda workdir: f"{workdir}/checkpoints/5")
  for name in predict.PRETRAINING_TASKS:
    monkeypatch.setattr(checkpointing, "read_meta",
                        lambda step_dir, name=name: {"task": {"name": name, "masking": {}}})
    with pytest.raises(ValueError, match=rf"^runs/tiny is a pretraining run \(task '{name}'\), "
                                         r"not a fine-tuned one: fine-tune it first \("
                                         r"launch/finetune.py --config.init_from=runs/tiny\), or "
                                         r"read it with --mode=fill_mask"):
      predict.load_finetuned("runs/tiny")
  monkeypatch.setattr(checkpointing, "read_meta", lambda step_dir: {"task": {"name": "ner"}})
  with pytest.raises(ValueError, match=r"not a fine-tuned checkpoint of this bert_jax version "
                                       r"\(task 'ner'\)"):
    predict.load_finetuned("runs/tiny")


def test_an_output_dir_that_is_a_file_is_one_line_and_the_file_stays(tmp_path):
  """The red team: "[Errno 20] Not a directory" from downstream, and fresh_output_dir with
  --overwrite would have removed a file as if it were an old export."""
  from bert_jax.weights import files  # pylint: disable=import-outside-toplevel
  path = tmp_path / "notes.txt"
  path.write_text("mine")
  for overwrite in (False, True):
    with pytest.raises(ValueError, match=r"notes.txt is a file, not a directory: give a "
                                         r"directory \(it is created if missing\)$"):
      files.fresh_output_dir(str(path), overwrite)
  with pytest.raises(ValueError, match=r"^--output_dir=\S+notes.txt is a file"):
    files.check_output_dir(str(path), "--output_dir")
  assert path.read_text() == "mine"
  assert files.check_output_dir(str(tmp_path / "new")) == str(tmp_path / "new")
