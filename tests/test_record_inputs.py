"""Record inputs (`bert_jax/data/inputs.py`): JSONL (plain, .gz, .zst), Parquet and HuggingFace
datasets directories prepare the rows of the same documents as text; a repeated document is
kept once and counted; a prepared JSONL dataset trains; Beam gives the local records; bad input
is one line naming the file and the row."""

import gzip
import json
import os
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bert_jax.data import blocks, corpus, inputs, sources, tfds_builder
from bert_jax.data import vocab as vocab_lib

WORDS = [f"w{i}" for i in range(120)]
SETTINGS = blocks.ExampleSettings(max_seq_length=48, dupe_factor=1, validation_fraction=0.1,
                                  block_chars=3000, max_examples_per_row=2)


def _texts(num: int, seed: int) -> list[str]:
  """Documents of a few sentences, each a record's text (one line: one paragraph)."""
  rng = random.Random(seed)
  return [" ".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10))).capitalize()
                   + "." for _ in range(rng.randint(2, 6))) for _ in range(num)]


def write_jsonl(path: str, texts, field: str = "text", **extra) -> str:
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "wt") as f:
    for i, text in enumerate(texts):
      f.write(json.dumps({"id": i, field: text, **extra}) + "\n")
  return path


def write_parquet(path: str, texts, field: str = "text", row_group_size: int = 7) -> str:
  pq.write_table(pa.table({"id": list(range(len(texts))), field: texts}), path,
                 row_group_size=row_group_size)
  return path


def write_dataset_dir(directory: str, texts, field: str = "text") -> str:
  """What `datasets.Dataset.save_to_disk` writes: Arrow stream files listed in state.json."""
  os.makedirs(directory)
  table = pa.table({field: texts, "id": list(range(len(texts)))})
  half = len(texts) // 2
  names = []
  for i, part in enumerate((table.slice(0, half), table.slice(half))):
    names.append(f"data-{i:05d}-of-00002.arrow")
    with pa.OSFile(os.path.join(directory, names[-1]), "wb") as sink:
      with pa.ipc.new_stream(sink, part.schema) as writer:
        for batch in part.to_batches(max_chunksize=5):
          writer.write_batch(batch)
  with open(os.path.join(directory, "state.json"), "w") as f:
    json.dump({"_data_files": [{"filename": n} for n in names], "_split": "train"}, f)
  with open(os.path.join(directory, "dataset_info.json"), "w") as f:
    json.dump({"features": {field: {"dtype": "string", "_type": "Value"}}}, f)
  return directory


def split_records(dataset_dir: str) -> dict[str, list[bytes]]:
  """Every split's raw records, in order."""
  out = {}
  for split in blocks.SPLITS:
    source = tfds_builder.data_source(dataset_dir, split, raw=True)
    out[split] = [source[i] for i in range(len(source))]
  return out


@pytest.fixture(scope="module")
def texts_and_vocab(tmp_path_factory):
  root = tmp_path_factory.mktemp("records")
  texts = _texts(120, seed=0)
  vocab = vocab_lib.train_sentencepiece(
      corpus.iter_sentences(corpus.text_to_document(t) for t in texts), str(root / "sp"), 300,
      "bpe")
  vocab_dir = str(root / "vocab")
  vocab.save(vocab_dir)
  return texts, vocab_dir


def _prepare(output_dir: str, paths, vocab_dir: str, **source) -> dict:
  return sources.prepare_corpus(
      output_dir, sources.CorpusSource(input=[str(p) for p in paths], **source),
      sources.VocabSource(path=vocab_dir), SETTINGS, num_workers=0)


def test_every_record_format_prepares_the_rows_of_the_same_text(texts_and_vocab, tmp_path):
  """JSONL, JSONL.gz, JSONL.zst, Parquet (several row groups) and a datasets directory give the
  records that the same documents give as plain text (`--input_format=paragraphs`)."""
  texts, vocab_dir = texts_and_vocab
  plain = tmp_path / "corpus.txt"
  plain.write_text("\n\n".join(texts) + "\n")
  zst = tmp_path / "c.jsonl.zst"
  with pa.output_stream(str(zst), compression="zstd") as f:
    for text in texts:
      f.write((json.dumps({"text": text}) + "\n").encode())
  inputs_of = {
      "paragraphs": ([plain], {"input_format": "paragraphs"}),
      "jsonl": ([write_jsonl(str(tmp_path / "c.jsonl"), texts)], {}),
      "jsonl.gz": ([write_jsonl(str(tmp_path / "c.jsonl.gz"), texts)], {}),
      "jsonl.zst": ([zst], {}),
      "parquet": ([write_parquet(str(tmp_path / "c.parquet"), texts)], {}),
      "datasets": ([write_dataset_dir(str(tmp_path / "hf"), texts)], {}),
      # Another field name, and a format given instead of found from the name.
      "field": ([write_jsonl(str(tmp_path / "c.data"), texts, field="content")],
                {"input_format": "jsonl", "text_field": "content"})}
  reference = None
  for name, (paths, source) in inputs_of.items():
    meta = _prepare(str(tmp_path / f"out_{name}"), paths, vocab_dir, **source)
    assert meta["corpus_stats"]["documents"] == len(texts), name
    records = split_records(str(tmp_path / f"out_{name}"))
    assert records["train"] and records["validation"], name
    reference = reference or records
    assert records == reference, name
  assert meta["corpus_stats"]["records"] == len(texts)
  assert inputs.file_format("a/b.JSONL.GZ") == "jsonl" and inputs.file_format("x.txt") == "bert"


def test_a_repeated_document_is_kept_once_and_counted(texts_and_vocab, tmp_path):
  """Identical documents (the shuffle's key: the same text) are dropped but one, also across
  files and formats; null and blank texts make no document. The rows are those of the corpus
  without the repeats."""
  texts, vocab_dir = texts_and_vocab
  unique = _prepare(str(tmp_path / "unique"), [write_jsonl(str(tmp_path / "u.jsonl"), texts)],
                    vocab_dir)
  repeated = texts[:30] + [texts[5]] * 3 + [None, "  "]
  meta = _prepare(str(tmp_path / "repeated"),
                  [write_jsonl(str(tmp_path / "a.jsonl"), texts[30:] + [texts[0]]),
                   write_parquet(str(tmp_path / "b.parquet"), repeated)], vocab_dir)
  stats = meta["corpus_stats"]
  assert (stats["duplicate_documents"], stats["empty_records"], stats["records"]) == (
      4, 2, len(texts) + 6)
  assert unique["corpus_stats"]["duplicate_documents"] == 0
  assert split_records(str(tmp_path / "repeated")) == split_records(str(tmp_path / "unique"))
  assert "Dropped 4 documents that repeat another's text and 2 records without text." in (
      sources.describe("out", meta))


def test_a_prepared_jsonl_corpus_trains(texts_and_vocab, tmp_path, one_device):
  from bert_jax import train  # pylint: disable=import-outside-toplevel
  from tests import modern_runs  # pylint: disable=import-outside-toplevel
  texts, vocab_dir = texts_and_vocab
  dataset = str(tmp_path / "dataset")
  meta = _prepare(dataset, [write_jsonl(str(tmp_path / "c.jsonl.gz"), texts * 1)], vocab_dir)
  config = modern_runs.tiny_config({
      "data.source": "prepared", "model.vocab_size": meta["vocab_size"],
      "data.max_seq_length": 48, "model.max_position_embeddings": 48,
      "train.num_train_steps": 4, "train.eval_every_steps": 4, "train.eval_batch_size": 8})
  config.data.dataset_dir = dataset
  result = train.train_and_evaluate(config, str(tmp_path / "run"))
  assert result["step"] == 4 and np.isfinite(result["train"]["loss"])
  assert np.isfinite(result["validation"]["mlm_loss"]), result["validation"]


BAD_JSONL = {
    "not_json": ('{"text": "A b."}\n{"text": "C d.",\n', "line 2 is not JSON"),
    "not_object": ('{"text": "A b."}\n["A b."]\n', "line 2 is a list, not a record"),
    "no_field": ('{"text": "A b."}\n{"body": "C d."}\n',
                 "line 2 has no field 'text' (its fields: body); set --text_field"),
    "not_text": ('{"text": "A b."}\n{"text": 7}\n', "line 2: field 'text' is a number, not text"),
    "empty": ("", "holds no records"),
}


@pytest.mark.parametrize("case", sorted(BAD_JSONL))
def test_bad_jsonl_is_one_line_naming_the_file_and_row(texts_and_vocab, tmp_path, case):
  _, vocab_dir = texts_and_vocab
  content, message = BAD_JSONL[case]
  path = tmp_path / "bad.jsonl"
  path.write_text(content)
  with pytest.raises(ValueError) as error:
    _prepare(str(tmp_path / "out"), [path], vocab_dir)
  assert str(error.value).startswith(f"Input file {path}") and message in str(error.value)
  assert "\n" not in str(error.value) and not os.path.exists(tmp_path / "out")


def test_bad_record_files_are_one_line(texts_and_vocab, tmp_path):
  texts, vocab_dir = texts_and_vocab

  def refused(paths, **source) -> str:
    with pytest.raises(ValueError) as error:
      _prepare(str(tmp_path / "out"), paths, vocab_dir, **source)
    assert "\n" not in str(error.value) and not os.path.exists(tmp_path / "out")
    return str(error.value)

  parquet = write_parquet(str(tmp_path / "p.parquet"), texts[:10])
  assert refused([parquet], text_field="body") == (
      f"Input file {parquet} has no column 'body' (its columns: id, text); set --text_field.")
  assert refused([parquet], text_field="id") == f"Input file {parquet}: column 'id' is int64, not text."
  garbage = tmp_path / "g.jsonl"  # Latin-1 bytes throughout: more than a tenth undecodable.
  garbage.write_bytes(b"".join(b'{"text": "caf\xe9 \xe0 \xe8\xe9\xea"}\n' for _ in range(5000)))
  assert refused([garbage]).startswith(f"Input file {garbage} is not text: ")
  broken = tmp_path / "b.parquet"
  broken.write_bytes(b"PAR1 not really")
  assert refused([broken]).startswith(f"Input file {broken} is not Parquet")
  splits = tmp_path / "dd"
  write_dataset_dir(str(splits / "train"), texts[:10])
  (splits / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
  assert "is a HuggingFace DatasetDict (splits: train, test); pass one split's directory" in (
      refused([splits]))
  assert "--input_format='csv' is not one of" in refused([parquet], input_format="csv")
  assert "holds no records" in refused([write_parquet(str(tmp_path / "e.parquet"), [])])


def test_beam_prepares_the_local_records_of_record_files(texts_and_vocab, tmp_path):
  """The same records from the Beam pipeline (DirectRunner) as from the local path, repeats
  dropped and counted alike."""
  texts, vocab_dir = texts_and_vocab
  paths = [write_jsonl(str(tmp_path / "a.jsonl.gz"), texts[:60] + texts[:5]),
           write_parquet(str(tmp_path / "b.parquet"), texts[60:] + [texts[70]])]
  local = _prepare(str(tmp_path / "local"), paths, vocab_dir)
  beamed = sources.prepare_corpus(
      str(tmp_path / "beam"), sources.CorpusSource(input=paths),
      sources.VocabSource(path=vocab_dir), SETTINGS, beam_runner="DirectRunner",
      beam_options=["--direct_num_workers=1"])
  assert split_records(str(tmp_path / "beam")) == split_records(str(tmp_path / "local"))
  assert beamed["corpus_stats"] == local["corpus_stats"]
  assert local["corpus_stats"]["duplicate_documents"] == 6


def test_the_launcher_prepares_jsonl_and_refuses_a_bad_row_in_one_line(texts_and_vocab,
                                                                       tmp_path):
  import sys  # pylint: disable=import-outside-toplevel
  from tests import forked_launch  # pylint: disable=import-outside-toplevel
  from tests.test_train_e2e import ROOT, _env  # pylint: disable=import-outside-toplevel
  texts, vocab_dir = texts_and_vocab
  good = write_jsonl(str(tmp_path / "a.jsonl.gz"), texts + texts[:3])
  bad = tmp_path / "b.jsonl"
  bad.write_text('{"text": "A b."}\n{"text": null}\n{"txt": "C d."}\n')
  command = [sys.executable, os.path.join(ROOT, "launch", "prepare_data.py"),
             f"--vocab={vocab_dir}", "--max_seq_length=48", "--num_workers=0"]
  done = forked_launch.run([*command, f"--input={good}", "--text_field=text",
                            f"--output_dir={tmp_path / 'good'}"], cwd=ROOT, env=_env())
  assert done.returncode == 0, done.stderr[-2000:]
  assert "Dropped 3 documents that repeat another's text." in done.stdout
  done = forked_launch.run([*command, f"--input={bad}", f"--output_dir={tmp_path / 'bad'}"],
                           cwd=ROOT, env=_env())
  assert done.returncode == 1 and "Traceback" not in done.stderr
  assert done.stderr.strip().splitlines()[-1] == (
      f"error: Input file {bad} line 3 has no field 'text' (its fields: txt); set --text_field.")
  assert not os.path.exists(tmp_path / "bad")
