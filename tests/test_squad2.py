"""SQuAD 2.0 (`config.data.version_2_with_negative`): questions without an answer train to
[CLS] in every window; decoding and scoring are held to line-by-line transcriptions of
google-research/bert run_squad.py's write_predictions (its version_2_with_negative branch) and
of the official evaluate-v2.0.py; a short fine-tuning run reports the v2.0 fields."""

import collections
import dataclasses
import json
import math
import re
import string

import numpy as np
import pytest

from bert_jax import finetune
from bert_jax.data import finetune as finetune_data
from bert_jax.data.vocab import Vocab
from bert_jax.models.model import BertConfig
from bert_jax.tasks import qa
from configs import finetune_qa
from tests.test_finetune import QA_CONTEXT, _qa_rows, _task, _task_vocab, finetune_config

OTHER_CONTEXT = "Carol Jones paid then red friends went home"  # 8 pieces: 2 windows of 6.
SHORT_CONTEXT = "Dave paid"  # 1 window.


def _records(*rows, impossible_flag=()):
  """(question, passage, answer or None) -> records of q.jsonl; None: "answers" is empty (and
  "is_impossible": true on the lines in `impossible_flag`)."""
  records = []
  for line, (question, context, answer) in enumerate(rows, start=1):
    answers = [] if answer is None else [{"text": answer, "answer_start": context.index(answer)}]
    fields = {"text": question, "text_b": context, "answers": answers}
    if line in impossible_flag:
      fields["is_impossible"] = True
    records.append(("q.jsonl", line, fields))
  return records


MIXED = _records(("who paid?", QA_CONTEXT, "Bob paid"), ("what color?", QA_CONTEXT, None),
                 ("who paid?", OTHER_CONTEXT, "Carol Jones"), ("what color?", OTHER_CONTEXT, None),
                 ("who paid?", SHORT_CONTEXT, "Dave"), ("how many?", SHORT_CONTEXT, None),
                 impossible_flag=(4,))


def _v2_task(threshold=0.0, max_answer_length=30, version_2=True):
  """A QA task on rows of 12 ([CLS] + 3 question pieces + [SEP] + 6 passage pieces + [SEP]),
  stride 3: QA_CONTEXT takes 3 windows, OTHER_CONTEXT 2, SHORT_CONTEXT 1."""
  task = _task("qa", max_length=12, doc_stride=3, max_answer_length=max_answer_length)
  return dataclasses.replace(task, settings=dataclasses.replace(
      task.settings, version_2_with_negative=version_2, null_score_diff_threshold=threshold))


@pytest.fixture(name="vocab")
def _vocab(tmp_path):
  return Vocab.load(_task_vocab(tmp_path))


# ----------------------------------------- run_squad.py's write_predictions, transcribed
# google-research/bert run_squad.py, write_predictions with FLAGS.version_2_with_negative True,
# line for line; the three JSON files it writes are returned instead. Examples are
# {"qas_id", "doc_tokens"}, features {"unique_id", "example_index", "tokens",
# "token_to_orig_map", "token_is_max_context"}, results {"unique_id", "start_logits",
# "end_logits"} (lists of Python floats, as its RawResult).

_PrelimPrediction = collections.namedtuple(
    "PrelimPrediction", ["feature_index", "start_index", "end_index", "start_logit", "end_logit"])
_NbestPrediction = collections.namedtuple("NbestPrediction", ["text", "start_logit", "end_logit"])


def _get_best_indexes(logits, n_best_size):
  index_and_score = sorted(enumerate(logits), key=lambda x: x[1], reverse=True)
  best_indexes = []
  for i in range(len(index_and_score)):
    if i >= n_best_size:
      break
    best_indexes.append(index_and_score[i][0])
  return best_indexes


def _compute_softmax(scores):
  if not scores:
    return []
  max_score = None
  for score in scores:
    if max_score is None or score > max_score:
      max_score = score
  exp_scores = []
  total_sum = 0.0
  for score in scores:
    x = math.exp(score - max_score)
    exp_scores.append(x)
    total_sum += x
  probs = []
  for score in exp_scores:
    probs.append(score / total_sum)
  return probs


def _get_final_text(pred_text, orig_text):
  """run_squad's get_final_text projects the de-tokenised pieces onto the original words. The
  passages here are whole-word pieces without punctuation, where the two are equal and it
  returns orig_text: this holds it to that case."""
  assert pred_text == orig_text, (pred_text, orig_text)
  return orig_text


def run_squad_write_predictions(all_examples, all_features, all_results, n_best_size,
                                max_answer_length, null_score_diff_threshold):
  example_index_to_features = collections.defaultdict(list)
  for feature in all_features:
    example_index_to_features[feature["example_index"]].append(feature)
  unique_id_to_result = {}
  for result in all_results:
    unique_id_to_result[result["unique_id"]] = result

  all_predictions = collections.OrderedDict()
  all_nbest_json = collections.OrderedDict()
  scores_diff_json = collections.OrderedDict()

  for (example_index, example) in enumerate(all_examples):
    features = example_index_to_features[example_index]

    prelim_predictions = []
    # keep track of the minimum score of null start+end of position 0
    score_null = 1000000  # large and positive
    min_null_feature_index = 0  # the paragraph slice with min mull score
    null_start_logit = 0  # the start logit at the slice with min null score
    null_end_logit = 0  # the end logit at the slice with min null score
    for (feature_index, feature) in enumerate(features):
      result = unique_id_to_result[feature["unique_id"]]
      start_indexes = _get_best_indexes(result["start_logits"], n_best_size)
      end_indexes = _get_best_indexes(result["end_logits"], n_best_size)
      # if we could have irrelevant answers, get the min score of irrelevant
      feature_null_score = result["start_logits"][0] + result["end_logits"][0]
      if feature_null_score < score_null:
        score_null = feature_null_score
        min_null_feature_index = feature_index
        null_start_logit = result["start_logits"][0]
        null_end_logit = result["end_logits"][0]
      for start_index in start_indexes:
        for end_index in end_indexes:
          if start_index >= len(feature["tokens"]):
            continue
          if end_index >= len(feature["tokens"]):
            continue
          if start_index not in feature["token_to_orig_map"]:
            continue
          if end_index not in feature["token_to_orig_map"]:
            continue
          if not feature["token_is_max_context"].get(start_index, False):
            continue
          if end_index < start_index:
            continue
          length = end_index - start_index + 1
          if length > max_answer_length:
            continue
          prelim_predictions.append(
              _PrelimPrediction(
                  feature_index=feature_index,
                  start_index=start_index,
                  end_index=end_index,
                  start_logit=result["start_logits"][start_index],
                  end_logit=result["end_logits"][end_index]))

    prelim_predictions.append(
        _PrelimPrediction(
            feature_index=min_null_feature_index,
            start_index=0,
            end_index=0,
            start_logit=null_start_logit,
            end_logit=null_end_logit))
    prelim_predictions = sorted(
        prelim_predictions,
        key=lambda x: (x.start_logit + x.end_logit),
        reverse=True)

    seen_predictions = {}
    nbest = []
    for pred in prelim_predictions:
      if len(nbest) >= n_best_size:
        break
      feature = features[pred.feature_index]
      if pred.start_index > 0:  # this is a non-null prediction
        tok_tokens = feature["tokens"][pred.start_index:(pred.end_index + 1)]
        orig_doc_start = feature["token_to_orig_map"][pred.start_index]
        orig_doc_end = feature["token_to_orig_map"][pred.end_index]
        orig_tokens = example["doc_tokens"][orig_doc_start:(orig_doc_end + 1)]
        tok_text = " ".join(tok_tokens)

        # De-tokenize WordPieces that have been split off.
        tok_text = tok_text.replace(" ##", "")
        tok_text = tok_text.replace("##", "")

        # Clean whitespace
        tok_text = tok_text.strip()
        tok_text = " ".join(tok_text.split())
        orig_text = " ".join(orig_tokens)

        final_text = _get_final_text(tok_text, orig_text)
        if final_text in seen_predictions:
          continue

        seen_predictions[final_text] = True
      else:
        final_text = ""
        seen_predictions[final_text] = True

      nbest.append(
          _NbestPrediction(
              text=final_text,
              start_logit=pred.start_logit,
              end_logit=pred.end_logit))

    # if we didn't inlude the empty option in the n-best, inlcude it
    if "" not in seen_predictions:
      nbest.append(
          _NbestPrediction(
              text="", start_logit=null_start_logit,
              end_logit=null_end_logit))
    # In very rare edge cases we could have no valid predictions. So we
    # just create a nonce prediction in this case to avoid failure.
    if not nbest:
      nbest.append(
          _NbestPrediction(text="empty", start_logit=0.0, end_logit=0.0))

    assert len(nbest) >= 1

    total_scores = []
    best_non_null_entry = None
    for entry in nbest:
      total_scores.append(entry.start_logit + entry.end_logit)
      if not best_non_null_entry:
        if entry.text:
          best_non_null_entry = entry

    probs = _compute_softmax(total_scores)

    nbest_json = []
    for (i, entry) in enumerate(nbest):
      output = collections.OrderedDict()
      output["text"] = entry.text
      output["probability"] = probs[i]
      output["start_logit"] = entry.start_logit
      output["end_logit"] = entry.end_logit
      nbest_json.append(output)

    assert len(nbest_json) >= 1

    # predict "" iff the null score - the score of best non-null > threshold
    score_diff = score_null - best_non_null_entry.start_logit - (
        best_non_null_entry.end_logit)
    scores_diff_json[example["qas_id"]] = score_diff
    if score_diff > null_score_diff_threshold:
      all_predictions[example["qas_id"]] = ""
    else:
      all_predictions[example["qas_id"]] = best_non_null_entry.text

    all_nbest_json[example["qas_id"]] = nbest_json
  return all_predictions, all_nbest_json, scores_diff_json


def _run_squad_inputs(data: qa.QAData, vocab: Vocab, start_logits, end_logits):
  """run_squad's examples, features and results for encoded windows and their logits. Passage
  pieces are whole words here, so a piece's index in the passage is its word's (doc_tokens)."""
  examples = []
  for index, example in enumerate(data.examples):
    assert len(example["piece_spans"]) == len(example["context"].split())
    examples.append({"qas_id": index, "doc_tokens": example["context"].split()})
  features, results = [], []
  for row, window in enumerate(data.windows):
    ids = data.arrays["input_ids"][row][:window.offset + window.doc_length + 1]
    features.append({
        "unique_id": row, "example_index": window.example,
        "tokens": [vocab.id_to_piece(int(i)) for i in ids],
        "token_to_orig_map": {window.offset + k: window.doc_start + k
                              for k in range(window.doc_length)},
        "token_is_max_context": {window.offset + k: bool(window.max_context[k])
                                 for k in range(window.doc_length)}})
    results.append({"unique_id": row, "start_logits": [float(x) for x in start_logits[row]],
                    "end_logits": [float(x) for x in end_logits[row]]})
  return examples, features, results


def _logits(data: qa.QAData, seed: int):
  """Hand-made [rows, 12] float32 logits: random, with [CLS] raised in the windows of
  questions without an answer and each gold span raised where a window holds it, by amounts
  that vary with the seed (so null and span scores come close to each other)."""
  rng = np.random.default_rng(seed)
  start = rng.normal(0.0, 2.0, data.arrays["input_ids"].shape).astype(np.float32)
  end = rng.normal(0.0, 2.0, start.shape).astype(np.float32)
  for row, window in enumerate(data.windows):
    if not data.examples[window.example]["answers"]:
      start[row, 0] += rng.uniform(1, 6)
      end[row, 0] += rng.uniform(1, 6)
    elif data.arrays["start_positions"][row] > 0:
      start[row, data.arrays["start_positions"][row]] += rng.uniform(0, 4)
      end[row, data.arrays["end_positions"][row]] += rng.uniform(0, 4)
  return start, end


# ------------------------------------------------------- evaluate-v2.0.py, transcribed
# The official SQuAD 2.0 evaluation script (rajpurkar.github.io/SQuAD-explorer), its scoring
# functions line for line; `evaluate_v2` is its main() with --na-prob-file given.


def make_qid_to_has_ans(dataset):
  qid_to_has_ans = {}
  for article in dataset:
    for p in article["paragraphs"]:
      for qa_ in p["qas"]:
        qid_to_has_ans[qa_["id"]] = bool(qa_["answers"])
  return qid_to_has_ans


def normalize_answer(s):
  """Lower text and remove punctuation, articles and extra whitespace."""
  def remove_articles(text):
    regex = re.compile(r"\b(a|an|the)\b", re.UNICODE)
    return re.sub(regex, " ", text)

  def white_space_fix(text):
    return " ".join(text.split())

  def remove_punc(text):
    exclude = set(string.punctuation)
    return "".join(ch for ch in text if ch not in exclude)

  def lower(text):
    return text.lower()
  return white_space_fix(remove_articles(remove_punc(lower(s))))


def get_tokens(s):
  if not s:
    return []
  return normalize_answer(s).split()


def compute_exact(a_gold, a_pred):
  return int(normalize_answer(a_gold) == normalize_answer(a_pred))


def compute_f1(a_gold, a_pred):
  gold_toks = get_tokens(a_gold)
  pred_toks = get_tokens(a_pred)
  common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
  num_same = sum(common.values())
  if len(gold_toks) == 0 or len(pred_toks) == 0:
    # If either is no-answer, then F1 is 1 if they agree, 0 otherwise
    return int(gold_toks == pred_toks)
  if num_same == 0:
    return 0
  precision = 1.0 * num_same / len(pred_toks)
  recall = 1.0 * num_same / len(gold_toks)
  f1 = (2 * precision * recall) / (precision + recall)
  return f1


def get_raw_scores(dataset, preds):
  exact_scores = {}
  f1_scores = {}
  for article in dataset:
    for p in article["paragraphs"]:
      for qa_ in p["qas"]:
        qid = qa_["id"]
        gold_answers = [a["text"] for a in qa_["answers"] if normalize_answer(a["text"])]
        if not gold_answers:
          # For unanswerable questions, only correct answer is empty string
          gold_answers = [""]
        if qid not in preds:
          print("Missing prediction for %s" % qid)
          continue
        a_pred = preds[qid]
        # Take max over all gold answers
        exact_scores[qid] = max(compute_exact(a, a_pred) for a in gold_answers)
        f1_scores[qid] = max(compute_f1(a, a_pred) for a in gold_answers)
  return exact_scores, f1_scores


def apply_no_ans_threshold(scores, na_probs, qid_to_has_ans, na_prob_thresh):
  new_scores = {}
  for qid, s in scores.items():
    pred_na = na_probs[qid] > na_prob_thresh
    if pred_na:
      new_scores[qid] = float(not qid_to_has_ans[qid])
    else:
      new_scores[qid] = s
  return new_scores


def make_eval_dict(exact_scores, f1_scores, qid_list=None):
  if not qid_list:
    total = len(exact_scores)
    return collections.OrderedDict([
        ("exact", 100.0 * sum(exact_scores.values()) / total),
        ("f1", 100.0 * sum(f1_scores.values()) / total),
        ("total", total),
    ])
  else:
    total = len(qid_list)
    return collections.OrderedDict([
        ("exact", 100.0 * sum(exact_scores[k] for k in qid_list) / total),
        ("f1", 100.0 * sum(f1_scores[k] for k in qid_list) / total),
        ("total", total),
    ])


def merge_eval(main_eval, new_eval, prefix):
  for k in new_eval:
    main_eval["%s_%s" % (prefix, k)] = new_eval[k]


def find_best_thresh(preds, scores, na_probs, qid_to_has_ans):
  num_no_ans = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
  cur_score = num_no_ans
  best_score = cur_score
  best_thresh = 0.0
  qid_list = sorted(na_probs, key=lambda k: na_probs[k])
  for i, qid in enumerate(qid_list):
    if qid not in scores:
      continue
    if qid_to_has_ans[qid]:
      diff = scores[qid]
    else:
      if preds[qid]:
        diff = -1
      else:
        diff = 0
    cur_score += diff
    if cur_score > best_score:
      best_score = cur_score
      best_thresh = na_probs[qid]
  return 100.0 * best_score / len(scores), best_thresh


def find_all_best_thresh(main_eval, preds, exact_raw, f1_raw, na_probs, qid_to_has_ans):
  best_exact, exact_thresh = find_best_thresh(preds, exact_raw, na_probs, qid_to_has_ans)
  best_f1, f1_thresh = find_best_thresh(preds, f1_raw, na_probs, qid_to_has_ans)
  main_eval["best_exact"] = best_exact
  main_eval["best_exact_thresh"] = exact_thresh
  main_eval["best_f1"] = best_f1
  main_eval["best_f1_thresh"] = f1_thresh


def evaluate_v2(dataset, preds, na_probs, na_prob_thresh=1.0):
  qid_to_has_ans = make_qid_to_has_ans(dataset)  # maps qid to True/False
  has_ans_qids = [k for k, v in qid_to_has_ans.items() if v]
  no_ans_qids = [k for k, v in qid_to_has_ans.items() if not v]
  exact_raw, f1_raw = get_raw_scores(dataset, preds)
  exact_thresh = apply_no_ans_threshold(exact_raw, na_probs, qid_to_has_ans,
                                        na_prob_thresh)
  f1_thresh = apply_no_ans_threshold(f1_raw, na_probs, qid_to_has_ans,
                                     na_prob_thresh)
  out_eval = make_eval_dict(exact_thresh, f1_thresh)
  if has_ans_qids:
    has_ans_eval = make_eval_dict(exact_thresh, f1_thresh, qid_list=has_ans_qids)
    merge_eval(out_eval, has_ans_eval, "HasAns")
  if no_ans_qids:
    no_ans_eval = make_eval_dict(exact_thresh, f1_thresh, qid_list=no_ans_qids)
    merge_eval(out_eval, no_ans_eval, "NoAns")
  find_all_best_thresh(out_eval, preds, exact_raw, f1_raw, na_probs, qid_to_has_ans)
  return out_eval


def _official(golds, predicted, na_probs, na_prob_thresh=1.0):
  """evaluate_v2 on per-question gold answer lists, predictions and na_probs (ids 0, 1, ...)."""
  dataset = [{"paragraphs": [{"qas": [{"id": i, "answers": [{"text": t} for t in answers]}
                                      for i, answers in enumerate(golds)]}]}]
  return evaluate_v2(dataset, dict(enumerate(predicted)), dict(enumerate(na_probs)),
                     na_prob_thresh)


def _assert_same_scores(ours, official):
  """Ours are fractions where the script prints percentages, "exact_match" for its "exact";
  counts and thresholds are equal, scores equal up to the * 100."""
  renamed = {"exact_match" if k == "exact" else k: v for k, v in official.items() if k != "total"}
  assert set(ours) == set(renamed), (sorted(ours), sorted(renamed))
  for name, value in renamed.items():
    if name.endswith(("_total", "_thresh")):
      assert ours[name] == value, name
    else:
      assert ours[name] * 100 == pytest.approx(value, rel=1e-12, abs=1e-12), name


# ---------------------------------------------------------------------------- decoding


@pytest.mark.parametrize("max_answer_length", [30, 2])
def test_v2_decoding_equals_run_squad(vocab, max_answer_length):
  """Six questions over 1-3 windows each (half without an answer), hand-made logits from five
  seeds, thresholds around the score differences and exactly at each of them: the answers and
  the differences equal the transcription's, and task.score its evaluation by the official
  script (na_probs: the differences, --na-prob-thresh: the threshold). Rows of 12 positions
  keep all of them among run_squad's n_best_size (20) best starts and ends, so its candidate
  spans are every valid span, as qa.best_span's."""
  data = _v2_task().encode(MIXED, vocab)
  assert [w.example for w in data.windows] == [0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 4, 5]
  golds = [example["answers"] for example in data.examples]
  for seed in range(5):
    start, end = _logits(data, seed)
    outputs = {"start_logits": start, "end_logits": end}
    inputs = _run_squad_inputs(data, vocab, start, end)
    _, _, diffs = run_squad_write_predictions(*inputs, 20, max_answer_length, 0.0)
    thresholds = [-1.0, 0.0, 0.7, *diffs.values(),
                  *(float(np.nextafter(d, -np.inf)) for d in diffs.values())]
    for threshold in thresholds:
      expected, nbest, expected_diffs = run_squad_write_predictions(
          *inputs, 20, max_answer_length, threshold)
      task = _v2_task(threshold, max_answer_length)
      predicted = task.predictions(outputs, data)
      assert [p["answer"] for p in predicted] == list(expected.values()), (seed, threshold)
      assert [p["score_diff"] for p in predicted] == list(expected_diffs.values())
      # The null entry is in every n-best list once; the threshold alone decides.
      assert all([e["text"] for e in entries].count("") == 1 for entries in nbest.values())
      for p, diff in zip(predicted, expected_diffs.values()):
        assert (p["answer"] == "") == (diff > threshold)
        assert p["null_score"] - p["score"] == pytest.approx(diff, abs=1e-9)
      _assert_same_scores(task.score(predicted, data),
                          _official(golds, list(expected.values()), list(expected_diffs.values()),
                                    threshold))
    # Exactly at a question's difference the span stands (the comparison is strict).
    at_edge = _v2_task(diffs[0], max_answer_length).predictions(outputs, data)[0]
    assert at_edge["answer"] and at_edge["answer"] in QA_CONTEXT


def test_v2_decoding_without_any_span(vocab):
  """An empty passage leaves no span: run_squad's n-best then holds only the null entry and it
  fails on best_non_null_entry (None); here the answer is "" with an infinite difference, at
  any threshold."""
  data = _v2_task().encode(_records(("who paid?", "", None)), vocab)
  start, end = _logits(data, 0)
  inputs = _run_squad_inputs(data, vocab, start, end)
  with pytest.raises(AttributeError, match="start_logit"):
    run_squad_write_predictions(*inputs, 20, 30, 0.0)
  for threshold in (-1e9, 0.0, 1e9):
    (predicted,) = _v2_task(threshold).predictions({"start_logits": start, "end_logits": end},
                                                   data)
    assert predicted["answer"] == "" and predicted["start"] == -1
    assert predicted["score_diff"] == math.inf and predicted["score"] == -math.inf
    assert predicted["null_score"] == float(start[0, 0]) + float(end[0, 0])


def test_null_score_is_the_least_over_windows():
  start = np.float32([[1.0, 0], [-2.0, 0], [0.5, 0], [3.0, 0]])  # [rows, L]
  end = np.float32([[1.0, 0], [0.5, 0], [0.5, 0], [-4.0, 0]])
  np.testing.assert_array_equal(qa.null_scores(start, end, [0, 0, 0, 1], 2), [-1.5, -1.0])


# ----------------------------------------------------------------------------- scoring


def test_v2_scores_equal_the_official_script():
  """Answered and unanswerable questions, right and wrong, punctuation and articles, several
  gold answers, gold answers that normalise to "" (left out; with none left only "" matches,
  though the question counts as answerable), ties in the na_probs, thresholds on either side
  of them."""
  golds = [["Bob paid"], ["Carol", "Carol Jones"], [], ["red"], [], ["the"], ["7 friends"],
           [], ["Dave."], ["an", "Bob"]]
  predicted = ["bob paid!", "Jones", "", "", "home", "", "7 red friends", "", "the Dave", ""]
  na_probs = [-2.5, 0.3, 1.7, 0.3, -0.4, 2.0, -1.0, 0.3, 5.0, 0.9]
  for threshold in (1.0, 0.0, 0.3, -0.5, -3.0, 6.0):
    ours = qa.squad_v2_scores(predicted, golds, na_probs, threshold)
    _assert_same_scores(ours, _official(golds, predicted, na_probs, threshold))
  assert qa.squad_v2_scores(predicted, golds, na_probs)["NoAns_total"] == 3
  # Only answerable questions: no NoAns_* fields, as the script.
  only = qa.squad_v2_scores(["Bob", "x"], [["Bob"], ["y"]], [0.1, -0.2])
  _assert_same_scores(only, _official([["Bob"], ["y"]], ["Bob", "x"], [0.1, -0.2]))
  assert "NoAns_exact" not in only
  # The single-answer functions, on the cases where v2.0 differs from v1.1.
  for gold, prediction in [("", ""), ("the", ""), ("a b", "b a c"), ("x", ""), ("", "x")]:
    assert qa.compute_exact(gold, prediction) == compute_exact(gold, prediction)
    assert qa.compute_f1(gold, prediction) == compute_f1(gold, prediction)


def test_score_reports_v2_fields_only_with_the_flag(vocab):
  data = _v2_task().encode(MIXED, vocab)
  start, end = _logits(data, 3)
  outputs = {"start_logits": start, "end_logits": end}
  v1 = _v2_task(version_2=False)
  v1_data = v1.encode(MIXED, vocab)
  v1_predicted = v1.predictions(outputs, v1_data)
  assert set(v1_predicted[0]) == {"answer", "start", "end", "score"}
  assert v1.score(v1_predicted, v1_data) == qa.squad_scores(
      [p["answer"] for p in v1_predicted], [e["answers"] for e in v1_data.examples])
  v2 = _v2_task()
  scores = v2.score(v2.predictions(outputs, data), data)
  assert {"exact_match", "f1", "HasAns_exact", "HasAns_f1", "HasAns_total", "NoAns_exact",
          "NoAns_f1", "NoAns_total", "best_exact", "best_exact_thresh", "best_f1",
          "best_f1_thresh"} == set(scores)
  assert v2.main_metric() == "f1"


# ---------------------------------------------------------------------------- encoding


def test_impossible_questions_target_cls_in_every_window(vocab):
  data = _v2_task().encode(MIXED, vocab, is_training=True)
  assert data.num_impossible == 3 and data.counts()["impossible"] == 3
  assert len(data.examples) == 6 and data.num_dropped == 0
  impossible = [row for row, w in enumerate(data.windows) if w.example in (1, 3, 5)]
  assert impossible == [3, 4, 5, 8, 9, 11]
  for name in ("start_positions", "end_positions"):
    np.testing.assert_array_equal(data.arrays[name][impossible], 0)
  np.testing.assert_array_equal(data.arrays["answer_weight"], 1.0)  # Every window trains.
  # Answerable questions keep run_squad's targets: "Bob paid" whole in window 2 only.
  np.testing.assert_array_equal(data.arrays["start_positions"][:3], [0, 0, 7])
  assert data.examples[1]["answers"] == [] and data.examples[0]["answers"] == ["Bob paid"]
  assert "3 without an answer" in _v2_task().describe("train", data)


def test_unanswerable_records_without_the_flag(vocab, tmp_path):
  path = tmp_path / "q.jsonl"
  path.write_text("\n".join(json.dumps(r[2]) for r in MIXED[:2]) + "\n")
  records = finetune_data.read_records(str(path))
  v1 = _v2_task(version_2=False)
  with pytest.raises(ValueError) as error:
    v1.encode(records, vocab, is_training=True)
  message = str(error.value)
  assert "\n" not in message and message.startswith(f"{path}, line 2: ")
  assert "config.data.version_2_with_negative" in message
  # Evaluation keeps v1.1's handling: no target weight, scored against "".
  data = v1.encode(records, vocab)
  np.testing.assert_array_equal(data.arrays["answer_weight"], [1, 1, 1, 0, 0, 0])
  assert data.num_impossible == 1


def test_is_impossible_field_is_checked(vocab):
  contradiction = _records(("who paid?", SHORT_CONTEXT, "Dave"), impossible_flag=(1,))
  with pytest.raises(ValueError, match=r"q\.jsonl, line 1: 'is_impossible' is true but"):
    _v2_task().encode(contradiction, vocab, is_training=True)
  not_bool = [("q.jsonl", 7, {"text": "who?", "text_b": "Dave", "answers": [],
                              "is_impossible": "yes"})]
  with pytest.raises(ValueError, match=r"q\.jsonl, line 7: field 'is_impossible' should be"):
    _v2_task().encode(not_bool, vocab, is_training=True)


def test_settings_read_the_config_and_old_checkpoints():
  config = finetune_qa.get_config()
  config.data.update(version_2_with_negative=True, null_score_diff_threshold=-1.5)
  settings = qa.QASettings.from_config(config, [], BertConfig())
  assert settings.version_2_with_negative is True and settings.null_score_diff_threshold == -1.5
  meta = dataclasses.asdict(settings)
  assert qa.QASettings.from_meta(meta) == settings
  del meta["version_2_with_negative"], meta["null_score_diff_threshold"]
  old = qa.QASettings.from_meta(meta)  # A checkpoint from before SQuAD 2.0: a v1.1 model.
  assert old.version_2_with_negative is False and old.null_score_diff_threshold == 0.0


def test_tfds_squad_v2_gives_is_impossible_as_a_bool():
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  with tfds.testing.mock_data(num_examples=3):
    records = finetune_data.read_tfds("squad/v2.0", "validation")
  assert len(records) == 3 and all(isinstance(r[2]["is_impossible"], bool) for r in records)
  assert records[0][0] == "tfds:squad/v2.0/validation" and "answers" in records[0][2]


# ------------------------------------------------------------------------- fine-tuning


def _mixed_rows(n, rng):
  """_qa_rows with every third question's answer removed (a SQuAD 2.0 unanswerable one)."""
  rows = _qa_rows(n, rng)
  for row in rows[::3]:
    row["answers"] = []
  return rows


def test_v2_finetuning_reports_v2_fields(tmp_path):
  config = finetune_config(finetune_qa, tmp_path, _mixed_rows, 2, vocab=_task_vocab(tmp_path),
                           n_train=32, n_validation=12, seq_len=24)
  config.data.update(version_2_with_negative=True, null_score_diff_threshold=0.0)
  result = finetune.finetune_and_evaluate(config, str(tmp_path / "run"))
  final = result["final"]
  assert result["train_impossible"] == 11 and result["validation_impossible"] == 4
  assert final["HasAns_total"] == 8 and final["NoAns_total"] == 4 and final["examples"] == 12
  for name in ("exact_match", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1",
               "best_exact", "best_f1"):
    assert 0.0 <= final[name] <= 1.0, name
  assert math.isfinite(final["best_f1_thresh"]) and math.isfinite(final["best_exact_thresh"])
  assert result["best_metric"] == "f1"
  with open(tmp_path / "run" / finetune.FINAL_EVAL_FILE) as f:
    assert json.load(f)["final"]["best_f1_thresh"] == final["best_f1_thresh"]
