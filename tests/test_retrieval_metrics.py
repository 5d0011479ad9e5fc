"""The IR metrics (bert_jax/downstream/retrieval.py) equal trec_eval's (pytrec_eval) and
ir-measures' on random runs with graded relevance, ties and unretrieved relevant documents; exact
search equals a brute-force ranking."""

import numpy as np
import pytest

from bert_jax.downstream import retrieval

pytrec_eval = pytest.importorskip("pytrec_eval")
ir_measures = pytest.importorskip("ir_measures")


def _random_case(seed: int, queries: int = 25, documents: int = 150):
  rng = np.random.default_rng(seed)
  qrels, run = {}, {}
  for q in range(queries):
    judged = rng.choice(documents, size=rng.integers(1, 12), replace=False)
    qrels[f"q{q}"] = {f"d{d}": int(rng.integers(0, 3)) for d in judged}
    retrieved = rng.choice(documents, size=rng.integers(5, 130), replace=False)
    # Scores rounded to one decimal: many ties, broken by document id.
    run[f"q{q}"] = {f"d{d}": float(np.round(rng.normal(), 1)) for d in retrieved}
  qrels["q_unjudged_only"] = {"d1": 0}
  run["q_unjudged_only"] = {"d1": 1.0, "d2": 0.5}
  run["q_not_in_qrels"] = {"d3": 1.0}
  return qrels, run


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_equal_trec_eval_and_ir_measures(seed):
  qrels, run = _random_case(seed)
  means, per_query = retrieval.evaluate(qrels, run)
  assert "q_not_in_qrels" not in per_query
  evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut_10", "recall_100", "map"})
  trec = evaluator.evaluate(run)
  top10 = {q: {d: scores[d] for d in retrieval.ranked(scores)[:10]} for q, scores in run.items()}
  trec_rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
  for q, metrics in per_query.items():
    assert metrics["ndcg@10"] == pytest.approx(trec[q]["ndcg_cut_10"], abs=1e-9), q
    assert metrics["recall@100"] == pytest.approx(trec[q]["recall_100"], abs=1e-9), q
    assert metrics["map"] == pytest.approx(trec[q]["map"], abs=1e-9), q
    assert metrics["mrr@10"] == pytest.approx(trec_rr[q]["recip_rank"], abs=1e-9), q
  # ir-measures picks a provider per measure, and some break ties their own way: compared on
  # the run without ties (trec_eval's order kept, each score nudged apart).
  run = {q: {d: -rank for rank, d in enumerate(retrieval.ranked(scores))}
         for q, scores in run.items()}
  means, _ = retrieval.evaluate(qrels, run)
  measures = [ir_measures.nDCG @ 10, ir_measures.RR @ 10, ir_measures.R @ 100, ir_measures.AP]
  aggregate = ir_measures.calc_aggregate(measures, qrels, run)
  names = dict(zip(measures, ("ndcg@10", "mrr@10", "recall@100", "map")))
  for measure, value in aggregate.items():
    assert means[names[measure]] == pytest.approx(value, abs=1e-9), measure


def test_no_query_with_judgements_is_refused():
  with pytest.raises(ValueError, match="no query of the run has relevance judgements"):
    retrieval.evaluate({"a": {"d": 1}}, {"b": {"d": 1.0}})


def test_exact_search_is_the_brute_force_ranking():
  rng = np.random.default_rng(0)
  queries, documents = rng.normal(size=(37, 8)), rng.normal(size=(200, 8))
  documents[5] = documents[6]  # A tie: the lower index first.
  scores, indices = retrieval.search(queries, documents, k=20, chunk=16)
  full = queries.astype(np.float32) @ documents.astype(np.float32).T
  for q in range(len(queries)):
    expected = sorted(range(len(documents)), key=lambda d: (-full[q, d], d))[:20]
    assert list(indices[q]) == expected
    np.testing.assert_allclose(scores[q], full[q, expected], rtol=1e-6)
  all_scores, all_indices = retrieval.search(queries, documents[:7], k=20)
  assert all_indices.shape == (37, 7)
  run = retrieval.run_from_search([f"q{i}" for i in range(37)], [f"d{i}" for i in range(7)],
                                  all_scores, all_indices)
  assert len(run["q0"]) == 7
