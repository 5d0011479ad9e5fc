"""The corpus-wide document shuffle before blocking (`bert_jax/data/shuffle.py`): random-next B
drawn from the whole corpus on topic-ordered input, output independent of the worker count, the
split independent of the seed, temporary files gone whatever happens."""

import collections
import os
import random

import numpy as np
import pytest

from bert_jax.data import blocks
from bert_jax.data import builtin
from bert_jax.data import prepare
from bert_jax.data import shuffle

TOPIC_BASE = {"aa": 1000, "bb": 2000}  # Topic a's ids are 1000 + N, topic b's 2000 + N.


class TopicTokenizer:
  """Whitespace tokenizer of "aaN" / "bbN" words (N < 1000), one piece each.

  Module level so that spawned preparation workers can unpickle it.
  """

  size = 3000
  pad_id, unk_id, cls_id, sep_id, mask_id = 0, 1, 2, 3, 4
  special_ids = (0, 1, 2, 3, 4)
  kind = "fake"

  def encode_with_word_starts(self, text: str) -> tuple[list[int], list[int]]:
    ids = [TOPIC_BASE[word[:2]] + int(word[2:]) for word in text.split()]
    return ids, [1] * len(ids)

  def save(self, directory: str) -> None:
    os.makedirs(directory, exist_ok=True)


def topic_ordered_corpus(docs_a: int, docs_b: int, seed: int = 0) -> list[list[str]]:
  """All of topic a's documents, then all of topic b's: disjoint vocabularies."""
  rng = random.Random(seed)
  return [[" ".join(f"{topic}{rng.randrange(1000)}" for _ in range(rng.randint(4, 9)))
           for _ in range(rng.randint(4, 10))]
          for topic, count in (("aa", docs_a), ("bb", docs_b)) for _ in range(count)]


def topic_of(ids: np.ndarray) -> str:
  """The topic of a segment's ids (one document's: a single topic)."""
  topics = {topic for topic, base in TOPIC_BASE.items()
            if ((ids >= base) & (ids < base + 1000)).any()}
  assert len(topics) == 1, ids
  return topics.pop()


def random_b_topics(batch) -> collections.Counter:
  """(topic of A, topic of B) of every random-next example of decoded rows."""
  pairs = collections.Counter()
  slots = batch["nsp_weights"].shape[1]
  for row in range(batch["input_ids"].shape[0]):
    for k in range(slots):
      if not batch["nsp_weights"][row, k] or not batch["next_sentence_label"][row, k]:
        continue
      inside = batch["segment_ids"][row] == k + 1
      ids = batch["input_ids"][row]
      words = inside & (ids >= 1000)
      a = ids[words & (batch["token_type_ids"][row] == 0)]
      b = ids[words & (batch["token_type_ids"][row] == 1)]
      pairs[topic_of(a), topic_of(b)] += 1
  return pairs


def test_random_b_from_the_whole_corpus_and_workers_do_not_matter(tmp_path):
  # Topic-ordered input of 60% topic a, 40% topic b documents, cut into ~25 blocks: unshuffled,
  # only the block at the topic boundary could pair an A with a B of the other topic.
  from bert_jax.data import pipeline
  from bert_jax.data import tfds_builder

  docs_a, docs_b = 1200, 800
  docs = topic_ordered_corpus(docs_a, docs_b)

  def run(name: str, num_workers: int) -> list[bytes]:
    prepare.prepare_dataset(
        str(tmp_path / name), lambda: iter(docs), TopicTokenizer(), max_seq_length=32,
        dupe_factor=1, validation_fraction=0.0, seed=3, num_workers=num_workers,
        block_chars=20_000, max_examples_per_row=2)
    source = tfds_builder.data_source(str(tmp_path / name), blocks.TRAIN, raw=True)
    return [source[i] for i in range(len(source))]

  records = run("one_worker", 1)
  assert run("four_workers", 4) == records  # Byte-identical.
  assert sorted(os.listdir(tmp_path)) == ["four_workers", "one_worker"]  # No temporary files.
  pairs = random_b_topics(pipeline.decode_records(records))
  total = docs_a + docs_b
  for topic, other, share_of_other in (("aa", "bb", docs_b / total), ("bb", "aa", docs_a / total)):
    count = pairs[topic, topic] + pairs[topic, other]
    assert count > 800
    # B's document is drawn uniformly among the other documents of A's block, a random sample
    # of the corpus: the other topic's share of B is its share of the corpus.
    assert abs(pairs[topic, other] / count - share_of_other) < 0.05, (topic, pairs)


def test_shuffle_is_the_seeded_key_order_cut_into_shards(tmp_path, monkeypatch):
  docs = [[f"doc {i} sentence {j}" for j in range(i % 4 + 1)] for i in range(600)]

  def shuffled(seed=0, **kwargs):
    work_dir = str(tmp_path / "work")
    result = list(shuffle.shuffled_documents(iter(docs), seed=seed, work_dir=work_dir, **kwargs))
    assert not os.path.exists(work_dir)  # Removed once read back.
    return result

  first = shuffled()
  order = [document for _, document in first]
  assert sorted(order) == sorted(docs) and order != docs
  # The order of the documents' keys: what any engine computes from each document alone.
  assert order == sorted(docs, key=lambda d: shuffle.document_key(0, d))
  assert {shard for shard, _ in first} == {0}  # A corpus under shard_chars: one shard.
  assert shuffled() == first and [d for _, d in shuffled(seed=1)] != order
  # Buffer flushes, and files too large to read whole (scattered again by the keys' next
  # byte), don't change the order.
  monkeypatch.setattr(shuffle, "WRITE_BUFFER_BYTES", 100)
  assert shuffled() == first
  assert shuffled(max_file_bytes=200) == first
  # Shards: 2**ceil(log2(chars / shard_chars)) equal key ranges, ascending.
  chars = sum(len(s) for d in docs for s in d)
  sharded = shuffled(shard_chars=chars // 5)
  assert [d for _, d in sharded] == order
  assert [shard for shard, _ in sharded] == sorted(shard for shard, _ in sharded)
  assert {shard for shard, _ in sharded} == set(range(8))
  assert all(shard == shuffle.shard_of(shuffle.document_key(0, d), 3) for shard, d in sharded)
  # Blank sentences and documents without any are dropped, sentences stripped.
  assert list(shuffle.shuffled_documents([[" x ", ""], [" "], []], seed=0,
                                         work_dir=str(tmp_path / "w"))) == [(0, ["x"])]
  # Uniform: which fifth of 10 documents the first one ends up in, over 200 seeds (chi-square,
  # 4 degrees of freedom, p = 0.001).
  places = collections.Counter(
      [d for _, d in shuffle.shuffled_documents(docs[:10], seed=seed, work_dir=str(
          tmp_path / "w"))].index(docs[0]) // 2 for seed in range(200))
  assert len(places) == 5 and sum((n - 40) ** 2 / 40 for n in places.values()) < 18.5, places


def test_blocks_are_cut_within_shards(tmp_path):
  docs = topic_ordered_corpus(300, 0, seed=2)
  chars = sum(len(s) for d in docs for s in d)
  settings = blocks.ExampleSettings(validation_fraction=0.1, block_chars=chars // 20,
                                    shard_chars=chars // 3)
  found = list(blocks.iter_prepared_blocks(docs, settings, str(tmp_path / "work")))
  assert {b.shard for b in found} == {0, 1, 2, 3}
  for block in found:  # Each block holds documents of its own shard only.
    assert {shuffle.shard_of(shuffle.document_key(0, d), 2) for d in block.documents} == {
        block.shard}
  names = [b.name for b in found]
  assert len(set(names)) == len(names)
  assert sorted(map(tuple, (d for b in found for d in b.documents))) == sorted(map(tuple, docs))


def test_shuffle_never_takes_an_existing_directory_and_cleans_up_on_failure(tmp_path):
  existing = tmp_path / "output"
  existing.mkdir()
  (existing / "keep.txt").write_text("x")
  with pytest.raises(FileExistsError):
    next(shuffle.shuffled_documents([["a b"]], seed=0, work_dir=str(existing)))
  assert os.listdir(existing) == ["keep.txt"]

  def failing():
    yield ["a b c"]
    raise RuntimeError("reader failed")

  with pytest.raises(RuntimeError, match="reader failed"):
    list(shuffle.shuffled_documents(failing(), seed=0, work_dir=str(tmp_path / "work")))
  documents = shuffle.shuffled_documents([["a"], ["b"]], seed=0, work_dir=str(tmp_path / "work"))
  next(documents)
  assert os.path.isdir(tmp_path / "work")
  documents.close()  # Abandoned halfway.
  assert sorted(os.listdir(tmp_path)) == ["output"]


def test_split_does_not_depend_on_the_seed(tmp_path):
  docs = topic_ordered_corpus(150, 150, seed=1)
  settings = blocks.ExampleSettings(validation_fraction=0.2, block_chars=3000)

  def by_split(seed):
    found = collections.defaultdict(list)
    for block in blocks.iter_prepared_blocks(
        docs, blocks.dataclasses.replace(settings, seed=seed), str(tmp_path / "work")):
      found[block.split] += block.documents
    return found

  first, second = by_split(0), by_split(1)
  for split in blocks.SPLITS:
    assert first[split] != second[split]  # Another order,
    assert sorted(first[split]) == sorted(second[split])  # the same documents.
  assert 40 < len(first[blocks.VALIDATION]) < 80


def test_builtin_key_follows_the_preparation_version(monkeypatch):
  settings = builtin.BuiltinSettings(
      vocab_size=400, vocab_model_type="bpe", max_mb=0.1, max_seq_length=32, short_seq_prob=0.1,
      dupe_factor=1, validation_fraction=0.05, objective="mlm_nsp", max_examples_per_row=2,
      seed=0)
  key = builtin.cache_key(settings, "corpus")
  monkeypatch.setattr(prepare, "PREPARATION_VERSION", prepare.PREPARATION_VERSION - 1)
  assert builtin.cache_key(settings, "corpus") != key  # Data cached before is not reused.
