"""The arithmetic of benchmarks/recipes.py's tables: minutes to reach the reference's final
accuracy (linear between evaluations; None for the reference itself and for a variant that never
gets there) and the curves read back from a race's log."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))
import recipes  # noqa: E402


def _curve(name, points):
  return {"kind": "curve", "variant": name,
          "points": [{"minutes": m, "steps": s, "mlm_accuracy": a} for m, s, a in points]}


def test_summary_interpolates_the_crossing_and_leaves_the_reference_and_laggards_empty():
  curves = [_curve("classic", [(0.0, 0, 0.0), (5.0, 500, 0.10), (10.0, 1000, 0.20)]),
            _curve("fast", [(0.0, 0, 0.0), (2.0, 200, 0.15), (4.0, 400, 0.25)]),
            _curve("slow", [(0.0, 0, 0.0), (10.0, 1000, 0.19)])]
  rows = {r["variant"]: r for r in recipes.summary(curves)}
  # The reference touches its own final at its last point: that is not "reaching" it.
  assert rows["classic"]["minutes_to_reference_final"] is None
  assert rows["classic"]["time_share"] is None
  # 0.20 lies half-way between 0.15 (2 min) and 0.25 (4 min): 3 minutes, 30% of classic's 10.
  assert rows["fast"]["minutes_to_reference_final"] == pytest.approx(3.0)
  assert rows["fast"]["time_share"] == pytest.approx(0.3)
  assert rows["fast"]["final_mlm_accuracy"] == 0.25 and rows["fast"]["steps"] == 400
  assert rows["slow"]["minutes_to_reference_final"] is None


def test_rows_from_log_reads_params_and_evaluation_lines(tmp_path):
  log = tmp_path / "race.log"
  log.write_text("classic: 1,478,786 params (embeddings 1,050,624)\n"
                 "  classic: 0.5 min, 100 steps, mlm_acc 0.0612\n"
                 "unrelated line\n"
                 "+rotary: 0.6 min, 100 steps, mlm_acc 0.0934\n"
                 "classic: 1.0 min, 200 steps, mlm_acc 0.0801\n")
  rows = recipes.rows_from_log(str(log))
  assert rows[0] == {"kind": "params", "variant": "classic", "params": 1478786}
  curves = {r["variant"]: r["points"] for r in rows if r["kind"] == "curve"}
  assert curves["classic"] == [{"minutes": 0.5, "steps": 100, "mlm_accuracy": 0.0612},
                               {"minutes": 1.0, "steps": 200, "mlm_accuracy": 0.0801}]
  assert curves["+rotary"] == [{"minutes": 0.6, "steps": 100, "mlm_accuracy": 0.0934}]


def test_random_ndcg_is_the_mean_over_every_rank_of_the_relevant_document():
  """local_suite.py's chance score for local_retrieval: with one relevant document among N,
  a random ranking puts it at each rank with probability 1/N, so the expectation is the mean
  of trec_eval's nDCG@10 over N queries whose relevant document sits at ranks 1..N."""
  import local_suite  # pylint: disable=import-outside-toplevel
  from bert_jax.downstream import retrieval  # pylint: disable=import-outside-toplevel
  for documents in (7, 10, 40):
    qrels = {f"q{r}": {f"d{r}": 1} for r in range(documents)}
    run = {}
    for r in range(documents):  # q{r}'s relevant d{r} at rank r + 1, the others around it.
      order = [f"d{j}" for j in range(documents) if j != r]
      order.insert(r, f"d{r}")
      run[f"q{r}"] = {d: float(documents - i) for i, d in enumerate(order)}
    measured = retrieval.evaluate(qrels, run)[0]["ndcg@10"]
    assert local_suite.random_ndcg_at_10(documents) == pytest.approx(measured, abs=1e-9)
  assert local_suite.random_ndcg_at_10(1) == 1.0
