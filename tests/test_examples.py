"""NSP example construction and rows: layout, packing, statistics, faithfulness to the
original, records."""

import ast
import collections
import os
import random

import numpy as np
import pytest

from bert_jax.data import blocks
from bert_jax.data import nsp
from bert_jax.data import packing
from bert_jax.data import records

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
DOC_BASE, SENT_BASE, WORD_BASE, PIECE_BASE, CONT_ID = 100, 1100, 2000, 3000, 3999


class FakeTokenizer:
  """Whitespace tokenizer: "dK" (doc id), "sK" (sentence index), "wK" one piece, "yK" two pieces.

  Module level so that spawned preparation workers can unpickle it.
  """

  size = 20000
  pad_id, unk_id, cls_id, sep_id, mask_id = PAD, UNK, CLS, SEP, MASK
  special_ids = (PAD, UNK, CLS, SEP, MASK)
  kind = "fake"

  def encode_with_word_starts(self, text: str) -> tuple[list[int], list[int]]:
    ids, starts = [], []
    for word in text.split():
      kind, number = word[0], int(word[1:])
      if kind == "y":
        ids += [PIECE_BASE + number, CONT_ID]
        starts += [1, 0]
      else:
        ids.append({"d": DOC_BASE, "s": SENT_BASE, "w": WORD_BASE}[kind] + number)
        starts.append(1)
    return ids, starts

  def save(self, directory: str) -> None:
    import os
    os.makedirs(directory, exist_ok=True)


def make_corpus(num_docs: int, seed: int, sentences=(20, 40), words=(2, 10)) -> list[list[str]]:
  """Documents whose sentences start with their doc id and sentence index tokens."""
  rng = random.Random(seed)
  docs = []
  for d in range(num_docs):
    doc = []
    for s in range(rng.randint(*sentences)):
      body = [f"{rng.choice('wy')}{rng.randint(0, 900)}" for _ in range(rng.randint(*words))]
      doc.append(" ".join([f"d{d}", f"s{s}", *body]))
    docs.append(doc)
  return docs


def tokenized(docs):
  return blocks.tokenize_documents(docs, FakeTokenizer())


def settings_for(seed=0, max_seq_length=64, short_seq_prob=0.1, dupe_factor=1, **kwargs):
  return blocks.ExampleSettings(
      max_seq_length=max_seq_length, short_seq_prob=short_seq_prob, dupe_factor=dupe_factor,
      validation_fraction=0.0, seed=seed, **kwargs)


def build_instances(docs, block_chars=blocks.ExampleSettings.block_chars, **kwargs):
  """Every block's instances in generation order (before the shuffle into rows)."""
  settings = settings_for(block_chars=block_chars, **kwargs)
  instances = []
  for block in blocks.iter_document_blocks(docs, validation_fraction=0.0, block_chars=block_chars):
    block_instances, _ = blocks.build_instances(block, FakeTokenizer(), settings)
    instances += block_instances
  return instances


def build_rows(docs, **kwargs):
  """The train split's rows as feature lists, in record order."""
  return list(blocks.iter_rows(docs, FakeTokenizer(), settings_for(**kwargs), blocks.TRAIN))


def split_pair(instance):
  """(A ids, B ids, tokens in the row) of one instance."""
  return instance.ids_a, instance.ids_b, packing.instance_length(instance)


def unpack_row(features):
  """A row's examples: [(A ids, B ids, label)], read back through its layout."""
  examples = []
  ids, segments = features["input_ids"], features["segment_ids"]
  for k, (start, weight) in enumerate(zip(features["cls_positions"], features["nsp_weights"]),
                                      start=1):
    if not weight:
      continue
    end = start
    while end < len(ids) and segments[end] == k:
      end += 1
    example = ids[start:end]
    seps = [i for i, t in enumerate(example) if t == SEP]
    assert example[0] == CLS and len(seps) == 2 and seps[1] == len(example) - 1
    examples.append((example[1:seps[0]], example[seps[0] + 1:-1],
                     features["next_sentence_label"][k - 1]))
  return examples


def doc_ids(tokens):
  return {t - DOC_BASE for t in tokens if DOC_BASE <= t < SENT_BASE}


def sentence_indices(tokens):
  return [t - SENT_BASE for t in tokens if SENT_BASE <= t < WORD_BASE]


def check_example_layout(features, start, k, instance):
  """The k-th example of a row, [CLS] at `start`, against its instance; returns its length."""
  a, b, n = split_pair(instance)
  ids, types, starts = features["input_ids"], features["token_type_ids"], features["word_starts"]
  span = range(start, start + n)
  assert [ids[i] for i in span] == [CLS, *a, SEP, *b, SEP]
  assert [types[i] for i in span] == [0] * (len(a) + 2) + [1] * (len(b) + 1)
  assert [features["segment_ids"][i] for i in span] == [k] * n
  assert [features["position_ids"][i] for i in span] == list(range(n))
  assert [starts[i] for i in span] == [0, *instance.word_starts_a, 0, *instance.word_starts_b, 0]
  assert features["cls_positions"][k - 1] == start and features["nsp_weights"][k - 1] == 1
  assert features["next_sentence_label"][k - 1] == int(instance.is_random_next)
  for i in span:  # The fake tokenizer's continuation piece never starts a word.
    offset = i - start
    if ids[i] == CONT_ID or offset in (0, len(a) + 1, n - 1):
      assert starts[i] == 0
    elif ids[i - 1] != CONT_ID:
      assert starts[i] == 1 or offset in (1, len(a) + 2)  # A/B may start mid-word (truncation).
  return n


@pytest.mark.parametrize("max_examples_per_row", [1, 3])
def test_row_layout(max_examples_per_row):
  length, slots = 64, max_examples_per_row
  settings = settings_for(max_seq_length=length, dupe_factor=2, short_seq_prob=0.3,
                          max_examples_per_row=slots)
  (block,) = blocks.iter_document_blocks(make_corpus(40, seed=1), validation_fraction=0.0,
                                         block_chars=10**9)
  rows, stats = blocks.build_block(block, FakeTokenizer(), settings)
  instances = list(blocks.build_instances(block, FakeTokenizer(), settings)[0])
  assert stats.rows == len(rows) and stats.examples == len(instances) > 300
  # Every instance in exactly one row, in some row order: the block's shuffle.
  in_rows = [instance for row in rows for instance in row]
  assert sorted(map(repr, in_rows)) == sorted(map(repr, instances)) and in_rows != instances
  assert max(map(len, rows)) == slots
  for row in rows:
    features = blocks.row_features(row, settings, FakeTokenizer())
    assert {len(features[name]) for name in packing.TOKEN_FEATURES} == {length}
    assert {len(features[name]) for name in packing.SLOT_FEATURES} == {slots}
    start = 0
    for k, instance in enumerate(row, start=1):
      start += check_example_layout(features, start, k, instance)
    assert start <= length and features["input_ids"][start:] == [PAD] * (length - start)
    for name in packing.TOKEN_FEATURES[1:]:
      assert features[name][start:] == [0] * (length - start), name
    for name in packing.SLOT_FEATURES:
      assert features[name][len(row):] == [0] * (slots - len(row)), name
    assert [(list(a), list(b), label) for a, b, label in unpack_row(features)] == [
        (i.ids_a, i.ids_b, int(i.is_random_next)) for i in row]
  fill = stats.real_tokens / (stats.rows * length)
  assert stats.real_tokens == sum(map(packing.instance_length, instances))
  assert fill > 0.9 if slots > 1 else fill < 0.9


def test_nsp_balance_and_random_next_source():
  # A chunk of one sentence always gets a random next (as the original): long documents and no
  # short targets (a short target makes every chunk one sentence) keep those rare, so the coin
  # flip's 50% shows. With short_seq_prob=0.1 the original gives ~55% random here.
  instances = build_instances(make_corpus(150, seed=2, sentences=(60, 90)), max_seq_length=64,
                              short_seq_prob=0.0, dupe_factor=2)
  assert len(instances) > 5000
  labels = np.array([i.is_random_next for i in instances])
  assert abs(labels.mean() - 0.5) < 0.03, labels.mean()
  checked = collections.Counter()
  for instance in instances:
    a, b, _ = split_pair(instance)
    docs_a, docs_b = doc_ids(a), doc_ids(b)
    if not docs_a or not docs_b:
      continue  # A side truncated from the front past its only doc id token.
    assert len(docs_a) == 1
    if instance.is_random_next:
      assert docs_a.isdisjoint(docs_b), (docs_a, docs_b)
    else:
      assert docs_a == docs_b
      # The real continuation: later sentences of the same document (truncation may drop the
      # index tokens at A's end or B's start, so a gap between A and B is allowed).
      for side in (sentence_indices(a), sentence_indices(b)):
        assert side == list(range(side[0], side[0] + len(side))) if side else True
      if sentence_indices(a) and sentence_indices(b):
        assert sentence_indices(a)[-1] < sentence_indices(b)[0]
    checked[instance.is_random_next] += 1
  assert min(checked.values()) > 1500


def test_short_target_fraction_per_document():
  docs = tokenized(make_corpus(3000, seed=3, sentences=(2, 6)))
  rng = random.Random(0)
  max_num_tokens = 64 - 3
  short = 0
  for i in range(len(docs)):
    instances = nsp.create_instances_from_document(docs, i, 64, 0.1, rng)
    targets = {inst.target_seq_length for inst in instances}
    assert len(targets) == 1  # Drawn once per document, as the original.
    target = targets.pop()
    assert 2 <= target <= max_num_tokens
    short += target < max_num_tokens
    for inst in instances:
      assert len(inst.ids_a) + len(inst.ids_b) <= max_num_tokens
  assert abs(short / len(docs) - 0.1) < 0.02, short / len(docs)


def original_truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
  """google-research/bert's truncate_seq_pair, verbatim."""
  while True:
    total_length = len(tokens_a) + len(tokens_b)
    if total_length <= max_num_tokens:
      break
    trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
    assert len(trunc_tokens) >= 1
    if rng.random() < 0.5:
      del trunc_tokens[0]
    else:
      trunc_tokens.pop()


def original_create_instances_from_document(all_documents, document_index, max_seq_length,
                                            short_seq_prob, rng):
  """google-research/bert's create_instances_from_document without the MLM masking."""
  document = all_documents[document_index]
  max_num_tokens = max_seq_length - 3
  target_seq_length = max_num_tokens
  if rng.random() < short_seq_prob:
    target_seq_length = rng.randint(2, max_num_tokens)
  instances = []
  current_chunk = []
  current_length = 0
  i = 0
  while i < len(document):
    segment = document[i]
    current_chunk.append(segment)
    current_length += len(segment)
    if i == len(document) - 1 or current_length >= target_seq_length:
      if current_chunk:
        a_end = 1
        if len(current_chunk) >= 2:
          a_end = rng.randint(1, len(current_chunk) - 1)
        tokens_a = []
        for j in range(a_end):
          tokens_a.extend(current_chunk[j])
        tokens_b = []
        is_random_next = False
        if len(current_chunk) == 1 or rng.random() < 0.5:
          is_random_next = True
          target_b_length = target_seq_length - len(tokens_a)
          for _ in range(10):
            random_document_index = rng.randint(0, len(all_documents) - 1)
            if random_document_index != document_index:
              break
          random_document = all_documents[random_document_index]
          random_start = rng.randint(0, len(random_document) - 1)
          for j in range(random_start, len(random_document)):
            tokens_b.extend(random_document[j])
            if len(tokens_b) >= target_b_length:
              break
          num_unused_segments = len(current_chunk) - a_end
          i -= num_unused_segments
        else:
          is_random_next = False
          for j in range(a_end, len(current_chunk)):
            tokens_b.extend(current_chunk[j])
        original_truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
        instances.append((tokens_a, tokens_b, is_random_next))
      current_chunk = []
      current_length = 0
    i += 1
  return instances


@pytest.mark.parametrize("max_seq_length,short_seq_prob", [(32, 0.1), (64, 0.5), (128, 0.0)])
def test_same_draws_as_original(max_seq_length, short_seq_prob):
  docs = tokenized(make_corpus(30, seed=4, sentences=(1, 30), words=(1, 40)))
  plain_docs = [[ids for ids, _ in doc] for doc in docs]
  rng_ours, rng_original = random.Random(7), random.Random(7)
  total = 0
  for i in range(len(docs)):
    ours = nsp.create_instances_from_document(docs, i, max_seq_length, short_seq_prob, rng_ours)
    original = original_create_instances_from_document(
        plain_docs, i, max_seq_length, short_seq_prob, rng_original)
    assert [(x.ids_a, x.ids_b, x.is_random_next) for x in ours] == original
    total += len(ours)
  assert total > 50


def test_truncation_matches_original():
  rng = random.Random(0)
  fronts = backs = 0
  for trial in range(300):
    a = list(range(rng.randint(1, 80)))
    b = list(range(1000, 1000 + rng.randint(1, 80)))
    max_num_tokens = rng.randint(2, 100)
    ours = nsp.truncate_seq_pair(a, b, max_num_tokens, random.Random(trial))
    a_ref, b_ref = list(a), list(b)
    original_truncate_seq_pair(a_ref, b_ref, max_num_tokens, random.Random(trial))
    assert ours == (a_ref, b_ref)
    assert len(ours[0]) + len(ours[1]) <= max_num_tokens and ours[0] and ours[1]
    if len(a) + len(b) > max_num_tokens:
      fronts += ours[0][0] != a[0] or ours[1][0] != b[0]
      backs += ours[0][-1] != a[-1] or ours[1][-1] != b[-1]
  assert fronts > 50 and backs > 50  # Both ends get trimmed.


def random_instance(rng, max_side):
  len_a, len_b = rng.randint(1, max_side), rng.randint(1, max_side)
  # Ids of one, two and three varint bytes.
  return packing.Instance(
      [rng.choice([5, 200, 20000, 69999]) for _ in range(len_a)],
      [rng.randint(0, 1) for _ in range(len_a)],
      [rng.randint(5, 69999) for _ in range(len_b)],
      [rng.randint(0, 1) for _ in range(len_b)], rng.random() < 0.5, 13)


@pytest.mark.parametrize("length,slots", [(16, 1), (16, 3), (200, 4)])  # 200: 2-byte positions.
def test_record_serializer_matches_tfds_features(length, slots):
  from tensorflow_datasets.proto import tf_example_pb2

  from bert_jax.data import tfds_builder

  features = tfds_builder.make_features(length, slots)
  serializer = records.RecordSerializer(length, slots, 70000, pad_id=PAD, cls_id=CLS, sep_id=SEP)
  rng = random.Random(0)

  def check(record, expected):
    decoded = features.deserialize_example_np(record)
    assert decoded.keys() == expected.keys()
    for name, value in expected.items():
      np.testing.assert_array_equal(decoded[name], value, err_msg=name)
    # The same tf.train.Example as TFDS's own serializer (map order aside).
    assert tf_example_pb2.Example.FromString(record) == tf_example_pb2.Example.FromString(
        features.serialize_example({k: np.asarray(v, np.int32) for k, v in expected.items()}))

  for _ in range(30):
    row = []
    for _ in range(rng.randint(1, slots)):
      instance = random_instance(rng, (length - 3) // (2 * slots))
      if sum(map(packing.instance_length, [*row, instance])) <= length:
        row.append(instance)
    row = row or [random_instance(rng, 3)]
    check(serializer.serialize_pairs([serializer.encode_pair(i) for i in row]),
          packing.nsp_row_features(row, length, slots, CLS, SEP, PAD))
  if slots == 1:  # FULL-SENTENCES rows (objective "mlm": K = 1), with a [SEP] inside.
    for n in (1, 5, length - 2):
      ids = [rng.choice([5, 200, 20000, SEP]) for _ in range(n)]
      sentences = packing.SentencesRow(ids, [int(t != SEP) for t in ids])
      check(serializer.serialize_sentences(serializer.encode_sentences(sentences)),
            packing.sentences_row_features(sentences, length, CLS, SEP, PAD))
  with pytest.raises(ValueError, match="vocab size"):
    serializer.encode_pair(packing.Instance([70000], [1], [5], [1], False, 13))
  with pytest.raises(ValueError, match="exceeds max_seq_length"):
    serializer.serialize_pairs([serializer.encode_pair(
        packing.Instance([5] * length, [1] * length, [5], [1], False, 13))])
  with pytest.raises(ValueError, match=f"1 to {slots} examples"):
    serializer.serialize_pairs([serializer.encode_pair(random_instance(rng, 1))] * (slots + 1))


def test_validation_assignment_by_hash():
  docs = make_corpus(4000, seed=5, sentences=(1, 2), words=(1, 3))
  flags = [blocks.is_validation_document(d, 0.1) for d in docs]
  assert abs(np.mean(flags) - 0.1) < 0.02
  assert flags == [blocks.is_validation_document(list(d), 0.1) for d in docs]  # Deterministic.
  assert not any(blocks.is_validation_document(d, 0.0) for d in docs)
  document_blocks = list(blocks.iter_document_blocks(docs, validation_fraction=0.1,
                                                     block_chars=5000))
  for block in document_blocks:
    assert all(blocks.is_validation_document(d, 0.1) == (block.split == blocks.VALIDATION)
               for d in block.documents)
  # Blocks hold about block_chars (one document over at most) and keep every document once.
  for block in document_blocks[:-2]:
    chars = sum(len(s) for d in block.documents for s in d)
    assert 5000 <= chars < 5000 + max(sum(len(s) for s in d) for d in block.documents)
  assert sum(len(b.documents) for b in document_blocks) == len(docs)
  indices = collections.defaultdict(list)
  for block in document_blocks:
    indices[block.split].append(block.index)
  assert all(v == list(range(len(v))) for v in indices.values())


def test_dupe_passes_differ_and_seed_determinism():
  docs = make_corpus(20, seed=6)
  once = build_instances(docs, seed=1, dupe_factor=1)
  twice = build_instances(docs, seed=1, dupe_factor=2)
  assert twice[:len(once)] == once and twice[len(once):] != once
  assert build_instances(docs, seed=1) == once
  assert build_instances(docs, seed=2) != once
  # Rows: the same seed gives the same rows (shuffle and packing included), another seed not.
  rows = build_rows(docs, seed=1, dupe_factor=2, max_examples_per_row=3)
  assert build_rows(docs, seed=1, dupe_factor=2, max_examples_per_row=3) == rows
  assert build_rows(docs, seed=2, dupe_factor=2, max_examples_per_row=3) != rows


def _read_records(dataset_dir):
  from bert_jax.data import tfds_builder

  return list(tfds_builder.data_source(dataset_dir, blocks.TRAIN, raw=True))


# block_chars=1: every block holds one document.
@pytest.mark.parametrize("block_chars,objective", [(3000, "mlm_nsp"), (1, "mlm_nsp"),
                                                   (3000, "mlm")])
def test_prepared_output_independent_of_worker_count(tmp_path, block_chars, objective):
  from bert_jax.data import prepare

  docs = make_corpus(60, seed=7, sentences=(3, 12))

  def run(name, num_workers, seed=0):
    return prepare.prepare_dataset(
        str(tmp_path / name), lambda: iter(docs), FakeTokenizer(), max_seq_length=48,
        dupe_factor=2, validation_fraction=0.2, seed=seed, num_workers=num_workers,
        block_chars=block_chars, objective=objective, max_examples_per_row=3)

  meta_inline = run("inline", 0)
  meta_pool = run("pool", 2)
  assert meta_inline["splits"] == meta_pool["splits"]
  assert meta_inline["stats"] == meta_pool["stats"]
  assert meta_inline["splits"]["validation"]["rows"] > 0
  assert meta_inline["max_examples_per_row"] == (3 if objective == "mlm_nsp" else 1)
  train_stats = meta_inline["stats"][blocks.TRAIN]
  if objective == "mlm":
    assert train_stats["random_next"] == train_stats["random_next_neighbour"] == 0
  elif block_chars == 1:  # Blocks of one document: every random B from a neighbour's.
    assert train_stats["random_next"] == train_stats["random_next_neighbour"] > 0
  train = meta_inline["splits"]["train"]
  assert train["fill_rate"] == pytest.approx(train["real_tokens"] / (train["rows"] * 48),
                                             abs=1e-6)
  # With blocks of one document, a block's examples rarely fill whole rows; FULL-SENTENCES rows
  # of whole sentences leave a gap of about half a sentence.
  assert train["fill_rate"] > {1: 0.6, 3000: 0.9 if objective == "mlm_nsp" else 0.8}[
      block_chars], train
  written = _read_records(str(tmp_path / "inline"))
  assert len(written) == train["rows"]
  assert written == _read_records(str(tmp_path / "pool"))
  run("other_seed", 0, seed=1)
  assert _read_records(str(tmp_path / "other_seed")) != written


# ---------------------------------------------------------------- random-next B never from A's


def flat_tokens(docs):
  """Each tokenized document's pieces, concatenated, as a tuple."""
  return [tuple(t for ids, _ in doc for t in ids) for doc in docs]


def contains(haystack, needle):
  n = len(needle)
  return any(haystack[i:i + n] == needle for i in range(len(haystack) - n + 1))


def check_random_b_sources(examples, docs):
  """Every random-next B is a piece of a document other than A's and of no sentence of A's.

  A's document is the one document whose tokens contain A. Returns the number checked.
  """
  flats = flat_tokens(tokenized(docs))
  checked = 0
  for instance in examples:
    if not instance.is_random_next:
      continue
    a, b = tuple(instance.ids_a), tuple(instance.ids_b)
    homes = [k for k, flat in enumerate(flats) if contains(flat, a)]
    assert len(homes) == 1, homes
    assert not contains(flats[homes[0]], b), (homes, b)
    assert any(contains(flat, b) for k, flat in enumerate(flats) if k != homes[0])
    checked += 1
  return checked


def test_blocks_of_one_document_carry_neighbours():
  docs = make_corpus(6, seed=8)
  document_blocks = list(blocks.iter_document_blocks(docs, validation_fraction=0.0, block_chars=1))
  assert [b.index for b in document_blocks] == list(range(6))
  assert all(len(b.documents) == 1 for b in document_blocks)
  # The previous block's documents; block 0 gets block 1's.
  assert document_blocks[0].neighbours == document_blocks[1].documents
  for i in range(1, 6):
    assert document_blocks[i].neighbours == document_blocks[i - 1].documents
  # Blocks of several documents carry none; a split of one document has none to carry.
  document_blocks = list(blocks.iter_document_blocks(
      make_corpus(20, seed=9), validation_fraction=0.0, block_chars=10**9))
  assert len(document_blocks) == 1 and document_blocks[0].neighbours == ()
  document_blocks = list(blocks.iter_document_blocks(docs[:1], validation_fraction=0.0,
                                                     block_chars=1))
  assert len(document_blocks) == 1 and document_blocks[0].neighbours == ()


def test_random_b_from_another_document_in_blocks_of_one_document():
  # block_chars=1: every block holds one document, so every random B comes from a neighbour.
  docs = make_corpus(8, seed=10, sentences=(5, 30))
  settings = blocks.ExampleSettings(max_seq_length=48, dupe_factor=3, validation_fraction=0.0,
                                    block_chars=1)
  examples = []
  stats = blocks.BlockStats()
  for block in blocks.iter_document_blocks(docs, validation_fraction=0.0, block_chars=1):
    instances, block_stats = blocks.build_instances(block, FakeTokenizer(), settings)
    instances = list(instances)
    assert instances
    examples += instances
    stats.add(block_stats)
  assert check_random_b_sources(examples, docs) > 100
  assert stats.random_next == stats.random_next_neighbour > 100
  assert stats.random_next_to_continuation == stats.random_next_skipped == 0


def test_random_b_from_another_document_when_the_last_block_holds_one():
  # Fewest documents whose last block (of ~3000 characters) holds exactly one document.
  block_chars = 3000
  for n in range(10, 200):
    docs = make_corpus(n, seed=11, sentences=(3, 12))
    document_blocks = list(blocks.iter_document_blocks(docs, validation_fraction=0.0,
                                                       block_chars=block_chars))
    if len(document_blocks) >= 2 and len(document_blocks[-1].documents) == 1:
      break
  else:
    raise AssertionError("no corpus size gives a last block of one document")
  assert document_blocks[-1].neighbours == document_blocks[-2].documents
  settings = blocks.ExampleSettings(max_seq_length=48, dupe_factor=5, validation_fraction=0.0,
                                    block_chars=block_chars)
  instances, stats = blocks.build_instances(document_blocks[-1], FakeTokenizer(), settings)
  last_examples = list(instances)
  assert stats.random_next == stats.random_next_neighbour > 0
  assert check_random_b_sources(last_examples, docs) == stats.random_next
  examples = build_instances(docs, max_seq_length=48, dupe_factor=5, block_chars=block_chars)
  assert examples[-len(last_examples):] == last_examples
  assert check_random_b_sources(examples, docs) > 50


def test_split_of_one_document_never_labels_its_own_text_random():
  # No other document anywhere: chunks that would get a random B get their real continuation,
  # or make no example when they have one sentence.
  docs = make_corpus(1, seed=12, sentences=(40, 40))
  settings = blocks.ExampleSettings(max_seq_length=48, short_seq_prob=0.3, dupe_factor=10,
                                    validation_fraction=0.0)
  (block,) = blocks.iter_document_blocks(docs, validation_fraction=0.0, block_chars=10**9)
  instances, stats = blocks.build_instances(block, FakeTokenizer(), settings)
  examples = list(instances)
  assert examples and stats.examples == len(examples)
  assert stats.random_next == stats.random_next_neighbour == 0
  assert stats.random_next_to_continuation > 10 and stats.random_next_skipped > 0
  for instance in examples:
    assert not instance.is_random_next
    a, b, _ = split_pair(instance)
    if sentence_indices(a) and sentence_indices(b):
      assert sentence_indices(a)[-1] < sentence_indices(b)[0]
  # A document of one sentence: its only chunk can have neither B.
  (block,) = blocks.iter_document_blocks([["d0 s0 w1 w2"]], validation_fraction=0.0, block_chars=1)
  instances, stats = blocks.build_instances(block, FakeTokenizer(), settings)
  assert list(instances) == [] and stats.random_next_skipped == settings.dupe_factor
  rows, stats = blocks.build_block(block, FakeTokenizer(), settings)
  assert rows == [] and stats.rows == 0


def test_few_documents_differ_from_original_only_where_it_takes_a_own_document():
  # With two documents, all ten tries hit A's own document once in 1024 random-next chunks: the
  # original then labels A's own text random; bert_jax draws once more, among the others.
  docs = tokenized(make_corpus(2, seed=13, sentences=(20, 30), words=(2, 6)))
  plain_docs = [[ids for ids, _ in doc] for doc in docs]
  flats = flat_tokens(docs)
  deviations = 0
  for seed in range(4000):
    document_index = seed % 2
    ours = nsp.create_instances_from_document(docs, document_index, 32, 0.1,
                                              random.Random(seed))
    ours = [(x.ids_a, x.ids_b, x.is_random_next) for x in ours]
    original = original_create_instances_from_document(plain_docs, document_index, 32, 0.1,
                                                       random.Random(seed))
    for ours_b in (x[1] for x in ours if x[2]):
      assert contains(flats[1 - document_index], tuple(ours_b))
    if ours == original:
      continue
    k = next(k for k, (x, y) in enumerate(zip(ours, original)) if x != y)
    # The first difference: the original's B comes from A's document, ours from the other one.
    assert original[k][2] and ours[k][2]
    assert contains(flats[document_index], tuple(original[k][1]))
    deviations += 1
  # 12: ~20k random-next chunks here, each with 1/1024 odds; a document counts once.
  assert deviations >= 10


# ---------------------------------------------------------------- packing


def check_packing(lengths, capacity, max_per_row):
  rows = packing.pack(lengths, capacity, max_per_row)
  assert sorted(i for row in rows for i in row) == list(range(len(lengths)))  # Each once.
  for row in rows:
    assert 1 <= len(row) <= max_per_row and sum(lengths[i] for i in row) <= capacity
    assert row == sorted(row)
  assert [row[0] for row in rows] == sorted(row[0] for row in rows)
  return rows


def test_pack_small_cases():
  assert packing.pack([], 10, 3) == []
  # Longest first, each into the fullest row that holds it: 7+3 | 6+4 | 5+2.
  assert packing.pack([5, 3, 7, 2, 6, 4], 10, 3) == [[0, 3], [1, 2], [4, 5]]
  assert packing.pack([2, 2, 2, 2], 10, 3) == [[0, 1, 2], [3]]
  assert packing.pack([2, 2, 2, 2], 10, 2) == [[0, 1], [2, 3]]  # K closes rows.
  assert packing.pack([4, 4, 4], 10, 1) == [[0], [1], [2]]  # K = 1: one item a row.
  assert packing.pack([10, 10], 10, 4) == [[0], [1]]


@pytest.mark.parametrize("max_per_row", [1, 2, 4, 8])
def test_pack_random_lengths(max_per_row):
  rng = random.Random(max_per_row)
  capacity = 128
  # Like NSP examples: many full rows, a tail of short ones.
  lengths = [capacity if rng.random() < 0.3 else rng.randint(5, capacity) for _ in range(3000)]
  rows = check_packing(lengths, capacity, max_per_row)
  assert check_packing(lengths, capacity, max_per_row) == rows  # Deterministic.
  fill = sum(lengths) / (len(rows) * capacity)
  lower_bound = max(-(-sum(lengths) // capacity), -(-len(lengths) // max_per_row))
  if max_per_row == 1:
    assert len(rows) == len(lengths)
  else:  # Best fit decreasing is within a few percent of the bound here.
    assert len(rows) <= 1.03 * lower_bound + 1, (len(rows), lower_bound, fill)
  # A row's place follows its first item, not its lengths: long and short rows interleave.
  first_half = [sum(lengths[i] for i in row) for row in rows[:len(rows) // 2]]
  second_half = [sum(lengths[i] for i in row) for row in rows[len(rows) // 2:]]
  assert abs(np.mean(first_half) - np.mean(second_half)) < 0.1 * capacity


def test_pack_bad_input():
  with pytest.raises(ValueError, match=r"item 2 has length 11, outside \[1, 10\]"):
    packing.pack([3, 10, 11], 10, 2)
  with pytest.raises(ValueError, match="item 0 has length 0"):
    packing.pack([0], 10, 2)
  with pytest.raises(ValueError, match="max_per_row=0"):
    packing.pack([1], 10, 0)
  with pytest.raises(ValueError, match="capacity=0"):
    packing.pack([1], 0, 1)
  with pytest.raises(ValueError, match="1 to 2 examples"):
    packing.nsp_row_features([packing.Instance([5], [1], [6], [1], False, 3)] * 3, 32, 2, CLS, SEP,
                             PAD)


def test_settings_validation():
  blocks.ExampleSettings(objective="mlm", max_examples_per_row=7).validate()
  assert blocks.ExampleSettings(objective="mlm", max_examples_per_row=7).examples_per_row == 1
  assert blocks.ExampleSettings(max_examples_per_row=7).examples_per_row == 7
  assert (packing.examples_per_row("mlm", 7), packing.examples_per_row("mlm_nsp", 7)) == (1, 7)
  with pytest.raises(ValueError, match="max_examples_per_row=0 must be >= 1.*--max_examples"):
    blocks.ExampleSettings(max_examples_per_row=0).validate()
  with pytest.raises(ValueError, match="objective='nsp' is not one of.*--objective"):
    blocks.ExampleSettings(objective="nsp").validate()


# ---------------------------------------------------------------- FULL-SENTENCES (objective mlm)


def test_full_sentence_rows():
  docs = tokenized(make_corpus(30, seed=14, sentences=(1, 12), words=(1, 12)))
  length = 48
  rows, num_cut = packing.full_sentence_rows(docs, length, SEP)
  # Full rows: every row but the last holds exactly L - 2 pieces.
  assert all(len(row.ids) == length - 2 for row in rows[:-1]) and 0 < len(rows[-1].ids)
  assert all(len(row.ids) == len(row.word_starts) for row in rows)
  # Read back: the documents' text in order, contiguous, a [SEP] between documents that meet
  # inside a row (never at a row's edge).
  restored = [t for row in rows for t in row.ids]
  stream = []
  for doc in docs:
    if stream and len(stream) % (length - 2):
      stream.append(SEP)
    stream += [t for ids, _ in doc for t in ids]
  assert restored == stream
  assert all(row.ids[0] != SEP and row.ids[-1] != SEP for row in rows)
  # Sentences cut at a row end continue at the start of the next row; they are counted.
  sentence_ends, position = set(), 0
  for doc_index, doc in enumerate(docs):
    position += bool(doc_index) and bool(position % (length - 2))
    for ids, _ in doc:
      position += len(ids)
      sentence_ends.add(position)
  boundaries = [(length - 2) * (r + 1) for r in range(len(rows) - 1)]
  assert num_cut == sum(b not in sentence_ends for b in boundaries) > 0
  word_starts = [s for row in rows for t, s in zip(row.ids, row.word_starts) if t != SEP]
  assert word_starts == [s for doc in docs for _, starts in doc for s in starts]
  for row in rows:
    features = packing.sentences_row_features(row, length, CLS, SEP, PAD)
    n = len(row.ids) + 2
    assert features["input_ids"] == [CLS, *row.ids, SEP] + [PAD] * (length - n)
    assert features["segment_ids"] == [1] * n + [0] * (length - n)
    assert features["position_ids"] == list(range(n)) + [0] * (length - n)
    assert features["token_type_ids"] == [0] * length
    assert features["word_starts"] == [0, *row.word_starts, 0] + [0] * (length - n)
    assert (features["cls_positions"], features["next_sentence_label"],
            features["nsp_weights"]) == ([0], [0], [0])


def test_full_sentence_rows_continue_long_sentences():
  doc_a = [(list(range(10, 15)), [1] * 5), (list(range(100, 125)), [1] * 25)]
  doc_b = [(list(range(200, 203)), [1, 0, 1])]
  rows, num_cut = packing.full_sentence_rows([doc_a, doc_b], 12, SEP)
  assert num_cut == 2  # The 25-piece sentence spans three rows.
  assert [row.ids for row in rows] == [
      [*range(10, 15), *range(100, 105)], list(range(105, 115)), list(range(115, 125)),
      [SEP, 200, 201, 202][1:]]  # Its document ended at a row boundary: no [SEP].
  assert rows[-1].word_starts == [1, 0, 1]


def test_mlm_block_rows(tmp_path):
  docs = make_corpus(40, seed=15, sentences=(2, 10))
  settings = settings_for(max_seq_length=64, dupe_factor=2, objective="mlm")
  (block,) = blocks.iter_document_blocks(docs, validation_fraction=0.0, block_chars=10**9)
  rows, stats = blocks.build_block(block, FakeTokenizer(), settings)
  assert stats.rows == stats.examples == len(rows) and stats.random_next == 0
  assert stats.real_tokens == sum(map(packing.sentences_row_length, rows))
  # Full rows but each pass's last one.
  assert stats.real_tokens > (stats.rows - 2) * 64
  # Each pass holds every token once; the passes order the documents differently.
  tokens = sum(len(ids) for doc in tokenized(docs) for ids, _ in doc)
  assert sum(t != SEP for row in rows for t in row.ids) == 2 * tokens
  passes = []
  for pass_index in range(2):
    order = list(range(len(docs)))
    random.Random(blocks.block_seed(0, blocks.TRAIN, pass_index, 0)).shuffle(order)
    passes.append(packing.full_sentence_rows([tokenized(docs)[i] for i in order], 64, SEP)[0])
  assert passes[0] != passes[1]
  assert sorted(rows) == sorted(passes[0] + passes[1])  # The passes' rows, shuffled together.
  assert rows != passes[0] + passes[1]
  features = [blocks.row_features(row, settings, FakeTokenizer()) for row in rows]
  assert all(f["nsp_weights"] == [0] and f["segment_ids"][0] == 1 for f in features)
  # The rows preparation writes: the same block after the corpus-wide shuffle.
  (shuffled,) = blocks.iter_prepared_blocks(docs, settings, str(tmp_path / "shuffle"))
  assert sorted(map(tuple, shuffled.documents)) == sorted(map(tuple, docs))
  assert build_rows(docs, max_seq_length=64, dupe_factor=2, objective="mlm",
                    max_examples_per_row=5) == [  # K plays no part in "mlm".
      blocks.row_features(row, settings, FakeTokenizer())
      for row in blocks.build_block(shuffled, FakeTokenizer(), settings)[0]]


def test_data_modules_import_no_cycle():
  """No module of bert_jax/data imports one that imports it back, deferred imports included
  (worker processes import the row builders: a circle there is an import-order bug)."""
  data_dir = os.path.dirname(packing.__file__)
  names = {f[:-3] for f in os.listdir(data_dir) if f.endswith(".py") and f != "__init__.py"}
  graph = {}
  for name in names:
    tree = ast.parse(open(os.path.join(data_dir, f"{name}.py")).read())
    graph[name] = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and node.module == "bert_jax.data":
        graph[name] |= {alias.name for alias in node.names} & names
      elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bert_jax.data."):
        graph[name].add(node.module.split(".")[2])
  assert graph["packing"] == set()  # The row layout and its types import no other module.

  def reaches(start, target, seen):
    return any(n == target or (n not in seen and reaches(n, target, seen | {n}))
               for n in graph[start])

  assert [name for name in sorted(names) if reaches(name, name, set())] == []
