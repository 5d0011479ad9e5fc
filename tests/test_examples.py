"""NSP example construction: layout, statistics, faithfulness to the original, records."""

import collections
import random

import numpy as np
import pytest

from bert_jax.data import examples as ex

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
  return ex.tokenize_documents(docs, FakeTokenizer())


def build_features(docs, seed=0, max_seq_length=64, short_seq_prob=0.1, dupe_factor=1):
  settings = ex.ExampleSettings(max_seq_length=max_seq_length, short_seq_prob=short_seq_prob,
                                dupe_factor=dupe_factor, validation_fraction=0.0, seed=seed)
  return list(ex.iter_examples(docs, FakeTokenizer(), settings, ex.TRAIN))


def split_pair(features):
  """(A ids, B ids, number of real tokens) from one padded example."""
  ids = features["input_ids"]
  n = sum(features["attention_mask"])
  seps = [i for i in range(n) if ids[i] == SEP]
  assert len(seps) == 2 and seps[1] == n - 1
  return ids[1:seps[0]], ids[seps[0] + 1:n - 1], n


def doc_ids(tokens):
  return {t - DOC_BASE for t in tokens if DOC_BASE <= t < SENT_BASE}


def sentence_indices(tokens):
  return [t - SENT_BASE for t in tokens if SENT_BASE <= t < WORD_BASE]


def test_layout_and_lengths():
  length = 64
  examples = build_features(make_corpus(40, seed=1), max_seq_length=length, dupe_factor=2)
  assert len(examples) > 300
  for f in examples:
    for name in ex.FEATURE_NAMES:
      assert len(f[name]) == length, name
    a, b, n = split_pair(f)
    assert a and b and n <= length
    ids, types, mask, starts = (f["input_ids"], f["token_type_ids"], f["attention_mask"],
                                f["word_starts"])
    assert ids[0] == CLS and ids[n:] == [PAD] * (length - n)
    assert types == [0] * (len(a) + 2) + [1] * (len(b) + 1) + [0] * (length - n)
    assert mask == [1] * n + [0] * (length - n)
    for i in [0, len(a) + 1, n - 1, *range(n, length)]:
      assert starts[i] == 0
    for i in range(n):  # The fake tokenizer's continuation piece never starts a word.
      if ids[i] == CONT_ID:
        assert starts[i] == 0
      elif ids[i] not in FakeTokenizer.special_ids and ids[i - 1] != CONT_ID:
        assert starts[i] == 1 or i in (1, len(a) + 2)  # A/B may start mid-word (truncation).
    assert f[ex.LABEL_NAME] in (0, 1)


def test_nsp_balance_and_random_next_source():
  # A chunk of one sentence always gets a random next (as the original): long documents and no
  # short targets (a short target makes every chunk one sentence) keep those rare, so the coin
  # flip's 50% shows. With short_seq_prob=0.1 the original gives ~55% random here.
  examples = build_features(make_corpus(150, seed=2, sentences=(60, 90)), max_seq_length=64,
                            short_seq_prob=0.0, dupe_factor=2)
  assert len(examples) > 5000
  labels = np.array([f[ex.LABEL_NAME] for f in examples])
  assert abs(labels.mean() - 0.5) < 0.03, labels.mean()
  checked = collections.Counter()
  for f in examples:
    a, b, _ = split_pair(f)
    docs_a, docs_b = doc_ids(a), doc_ids(b)
    if not docs_a or not docs_b:
      continue  # A side truncated from the front past its only doc id token.
    assert len(docs_a) == 1
    if f[ex.LABEL_NAME]:
      assert docs_a.isdisjoint(docs_b), (docs_a, docs_b)
    else:
      assert docs_a == docs_b
      # The real continuation: later sentences of the same document (truncation may drop the
      # index tokens at A's end or B's start, so a gap between A and B is allowed).
      for side in (sentence_indices(a), sentence_indices(b)):
        assert side == list(range(side[0], side[0] + len(side))) if side else True
      if sentence_indices(a) and sentence_indices(b):
        assert sentence_indices(a)[-1] < sentence_indices(b)[0]
    checked[f[ex.LABEL_NAME]] += 1
  assert min(checked.values()) > 1500


def test_short_target_fraction_per_document():
  docs = tokenized(make_corpus(3000, seed=3, sentences=(2, 6)))
  rng = random.Random(0)
  max_num_tokens = 64 - 3
  short = 0
  for i in range(len(docs)):
    instances = ex.create_instances_from_document(docs, i, 64, 0.1, rng)
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
    ours = ex.create_instances_from_document(docs, i, max_seq_length, short_seq_prob, rng_ours)
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
    ours = ex.truncate_seq_pair(a, b, max_num_tokens, random.Random(trial))
    a_ref, b_ref = list(a), list(b)
    original_truncate_seq_pair(a_ref, b_ref, max_num_tokens, random.Random(trial))
    assert ours == (a_ref, b_ref)
    assert len(ours[0]) + len(ours[1]) <= max_num_tokens and ours[0] and ours[1]
    if len(a) + len(b) > max_num_tokens:
      fronts += ours[0][0] != a[0] or ours[1][0] != b[0]
      backs += ours[0][-1] != a[-1] or ours[1][-1] != b[-1]
  assert fronts > 50 and backs > 50  # Both ends get trimmed.


def test_record_serializer_matches_tfds_features():
  from tensorflow_datasets.proto import tf_example_pb2

  from bert_jax.data import tfds_builder

  features = tfds_builder.make_features(16)
  serializer = ex.RecordSerializer(16, 70000, pad_id=PAD)
  rng = random.Random(0)
  for _ in range(20):
    len_a, len_b = rng.randint(1, 6), rng.randint(1, 7)
    # Ids of one, two and three varint bytes.
    instance = ex.Instance(
        [rng.choice([5, 200, 20000, 69999]) for _ in range(len_a)],
        [rng.randint(0, 1) for _ in range(len_a)],
        [rng.randint(5, 69999) for _ in range(len_b)],
        [rng.randint(0, 1) for _ in range(len_b)], rng.random() < 0.5, 13)
    decoded = features.deserialize_example_np(serializer.serialize(instance, CLS, SEP))
    expected = ex.instance_to_features(instance, 16, CLS, SEP, PAD)
    for name, value in expected.items():
      np.testing.assert_array_equal(decoded[name], value, err_msg=name)
    # The same tf.train.Example as TFDS's own serializer (map order aside).
    ours = tf_example_pb2.Example.FromString(serializer.serialize(instance, CLS, SEP))
    assert ours == tf_example_pb2.Example.FromString(features.serialize_example(
        {k: np.asarray(v, np.int32) for k, v in expected.items()}))
  with pytest.raises(ValueError, match="vocab size"):
    serializer.serialize(ex.Instance([70000], [1], [5], [1], False, 13), CLS, SEP)


def test_validation_assignment_by_hash():
  docs = make_corpus(4000, seed=5, sentences=(1, 2), words=(1, 3))
  flags = [ex.is_validation_document(d, 0.1) for d in docs]
  assert abs(np.mean(flags) - 0.1) < 0.02
  assert flags == [ex.is_validation_document(list(d), 0.1) for d in docs]  # Deterministic.
  assert not any(ex.is_validation_document(d, 0.0) for d in docs)
  blocks = list(ex.iter_document_blocks(docs, validation_fraction=0.1, block_chars=5000))
  for block in blocks:
    assert all(ex.is_validation_document(d, 0.1) == (block.split == ex.VALIDATION)
               for d in block.documents)
  # Blocks hold about block_chars (one document over at most) and keep every document once.
  for block in blocks[:-2]:
    chars = sum(len(s) for d in block.documents for s in d)
    assert 5000 <= chars < 5000 + max(sum(len(s) for s in d) for d in block.documents)
  assert sum(len(b.documents) for b in blocks) == len(docs)
  indices = collections.defaultdict(list)
  for block in blocks:
    indices[block.split].append(block.index)
  assert all(v == list(range(len(v))) for v in indices.values())


def test_dupe_passes_differ_and_seed_determinism():
  docs = make_corpus(20, seed=6)
  once = build_features(docs, seed=1, dupe_factor=1)
  twice = build_features(docs, seed=1, dupe_factor=2)
  assert twice[:len(once)] == once and twice[len(once):] != once
  assert build_features(docs, seed=1) == once
  assert build_features(docs, seed=2) != once


def _read_records(dataset_dir):
  from bert_jax.data import tfds_builder

  return list(tfds_builder.data_source(dataset_dir, ex.TRAIN, raw=True))


@pytest.mark.parametrize("block_chars", [3000, 1])  # 1: every block holds one document.
def test_prepared_output_independent_of_worker_count(tmp_path, block_chars):
  from bert_jax.data import prepare

  docs = make_corpus(60, seed=7, sentences=(3, 12))

  def run(name, num_workers, seed=0):
    return prepare.prepare_dataset(
        str(tmp_path / name), lambda: iter(docs), FakeTokenizer(), max_seq_length=48,
        dupe_factor=2, validation_fraction=0.2, seed=seed, num_workers=num_workers,
        block_chars=block_chars)

  meta_inline = run("inline", 0)
  meta_pool = run("pool", 2)
  assert meta_inline["num_examples"] == meta_pool["num_examples"]
  assert meta_inline["stats"] == meta_pool["stats"]
  assert meta_inline["num_examples"]["validation"] > 0
  neighbour_draws = meta_inline["stats"][ex.TRAIN]["random_next_neighbour"]
  assert neighbour_draws > 0 if block_chars == 1 else neighbour_draws == 0
  records = _read_records(str(tmp_path / "inline"))
  assert len(records) == meta_inline["num_examples"]["train"]
  assert records == _read_records(str(tmp_path / "pool"))
  run("other_seed", 0, seed=1)
  assert _read_records(str(tmp_path / "other_seed")) != records


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
  for f in examples:
    if not f[ex.LABEL_NAME]:
      continue
    a, b, _ = split_pair(f)
    a, b = tuple(a), tuple(b)
    homes = [k for k, flat in enumerate(flats) if contains(flat, a)]
    assert len(homes) == 1, homes
    assert not contains(flats[homes[0]], b), (homes, b)
    assert any(contains(flat, b) for k, flat in enumerate(flats) if k != homes[0])
    checked += 1
  return checked


def test_blocks_of_one_document_carry_neighbours():
  docs = make_corpus(6, seed=8)
  blocks = list(ex.iter_document_blocks(docs, validation_fraction=0.0, block_chars=1))
  assert [b.index for b in blocks] == list(range(6))
  assert all(len(b.documents) == 1 for b in blocks)
  # The previous block's documents; block 0 gets block 1's.
  assert blocks[0].neighbours == blocks[1].documents
  for i in range(1, 6):
    assert blocks[i].neighbours == blocks[i - 1].documents
  # Blocks of several documents carry none; a split of one document has none to carry.
  blocks = list(ex.iter_document_blocks(make_corpus(20, seed=9), validation_fraction=0.0,
                                        block_chars=10**9))
  assert len(blocks) == 1 and blocks[0].neighbours == ()
  blocks = list(ex.iter_document_blocks(docs[:1], validation_fraction=0.0, block_chars=1))
  assert len(blocks) == 1 and blocks[0].neighbours == ()


def test_random_b_from_another_document_in_blocks_of_one_document():
  # block_chars=1: every block holds one document, so every random B comes from a neighbour.
  docs = make_corpus(8, seed=10, sentences=(5, 30))
  settings = ex.ExampleSettings(max_seq_length=48, dupe_factor=3, validation_fraction=0.0,
                                block_chars=1)
  examples = list(ex.iter_examples(docs, FakeTokenizer(), settings, ex.TRAIN))
  assert check_random_b_sources(examples, docs) > 100
  stats = ex.BlockStats()
  for block in ex.iter_document_blocks(docs, validation_fraction=0.0, block_chars=1):
    instances, block_stats = ex.build_block(block, FakeTokenizer(), settings)
    assert sum(1 for _ in instances) > 0
    stats.add(block_stats)
  assert stats.random_next == stats.random_next_neighbour > 100
  assert stats.random_next_to_continuation == stats.random_next_skipped == 0


def test_random_b_from_another_document_when_the_last_block_holds_one():
  # Fewest documents whose last block (of ~3000 characters) holds exactly one document.
  block_chars = 3000
  for n in range(10, 200):
    docs = make_corpus(n, seed=11, sentences=(3, 12))
    blocks = list(ex.iter_document_blocks(docs, validation_fraction=0.0,
                                          block_chars=block_chars))
    if len(blocks) >= 2 and len(blocks[-1].documents) == 1:
      break
  else:
    raise AssertionError("no corpus size gives a last block of one document")
  assert blocks[-1].neighbours == blocks[-2].documents
  settings = ex.ExampleSettings(max_seq_length=48, dupe_factor=5, validation_fraction=0.0,
                                block_chars=block_chars)
  instances, stats = ex.build_block(blocks[-1], FakeTokenizer(), settings)
  last_examples = [ex.instance_to_features(i, 48, CLS, SEP, PAD) for i in instances]
  assert stats.random_next == stats.random_next_neighbour > 0
  assert check_random_b_sources(last_examples, docs) == stats.random_next
  examples = list(ex.iter_examples(docs, FakeTokenizer(), settings, ex.TRAIN))
  assert examples[-len(last_examples):] == last_examples
  assert check_random_b_sources(examples, docs) > 50


def test_split_of_one_document_never_labels_its_own_text_random():
  # No other document anywhere: chunks that would get a random B get their real continuation,
  # or make no example when they have one sentence.
  docs = make_corpus(1, seed=12, sentences=(40, 40))
  settings = ex.ExampleSettings(max_seq_length=48, short_seq_prob=0.3, dupe_factor=10,
                                validation_fraction=0.0)
  (block,) = ex.iter_document_blocks(docs, validation_fraction=0.0, block_chars=10**9)
  instances, stats = ex.build_block(block, FakeTokenizer(), settings)
  examples = [ex.instance_to_features(i, 48, CLS, SEP, PAD) for i in instances]
  assert examples and stats.examples == len(examples)
  assert stats.random_next == stats.random_next_neighbour == 0
  assert stats.random_next_to_continuation > 10 and stats.random_next_skipped > 0
  for f in examples:
    assert f[ex.LABEL_NAME] == 0
    a, b, _ = split_pair(f)
    if sentence_indices(a) and sentence_indices(b):
      assert sentence_indices(a)[-1] < sentence_indices(b)[0]
  # A document of one sentence: its only chunk can have neither B.
  (block,) = ex.iter_document_blocks([["d0 s0 w1 w2"]], validation_fraction=0.0, block_chars=1)
  instances, stats = ex.build_block(block, FakeTokenizer(), settings)
  assert list(instances) == [] and stats.random_next_skipped == settings.dupe_factor


def test_few_documents_differ_from_original_only_where_it_takes_a_own_document():
  # With two documents, all ten tries hit A's own document once in 1024 random-next chunks: the
  # original then labels A's own text random; bert_jax draws once more, among the others.
  docs = tokenized(make_corpus(2, seed=13, sentences=(20, 30), words=(2, 6)))
  plain_docs = [[ids for ids, _ in doc] for doc in docs]
  flats = flat_tokens(docs)
  deviations = 0
  for seed in range(4000):
    document_index = seed % 2
    ours = ex.create_instances_from_document(docs, document_index, 32, 0.1,
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
