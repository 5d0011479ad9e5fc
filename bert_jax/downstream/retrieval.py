"""Retrieval evaluation: exact nearest-neighbour search over embeddings, and the IR metrics of a
run as trec_eval computes them (pytrec_eval, ir-measures and BEIR report the same numbers).

A run is {query id: {document id: score}}; qrels are {query id: {document id: relevance}}.
Documents are ranked by score, highest first, ties broken by document id, the later one in
reverse string order first (trec_eval's rule). A document is relevant at relevance >= 1.
- nDCG@k: sum over the top k of rel / log2(rank + 1) (trec_eval's linear gain), over the same
  sum for the ideal order of the judged documents;
- MRR@k: 1 / rank of the first relevant document in the top k, 0 if none;
- recall@k: relevant documents in the top k over all relevant documents of the query;
- MAP: the mean over relevant documents of the precision at each one's rank (0 for one never
  retrieved), over the run as given.
Means are over the run's queries that have qrels (trec_eval's default); a query without a
relevant document scores 0 where its denominator would be 0.
"""

import math
from typing import Mapping

import numpy as np

Qrels = Mapping[str, Mapping[str, int]]
Run = Mapping[str, Mapping[str, float]]
METRICS = ("ndcg@10", "mrr@10", "recall@100", "map")


def ranked(scores: Mapping[str, float]) -> list[str]:
  """Document ids by trec_eval's order: score descending, then document id descending."""
  return [doc for doc, _ in sorted(scores.items(), key=lambda item: (item[1], item[0]),
                                   reverse=True)]


def query_metrics(relevance: Mapping[str, int], scores: Mapping[str, float]) -> dict[str, float]:
  """The metrics of one query: its judged documents and its run."""
  order = ranked(scores)
  gains = [max(int(relevance.get(doc, 0)), 0) for doc in order]
  relevant_total = sum(1 for value in relevance.values() if value >= 1)
  dcg = sum(g / math.log2(rank + 2) for rank, g in enumerate(gains[:10]) if g > 0)
  ideal = sorted((v for v in relevance.values() if v > 0), reverse=True)[:10]
  idcg = sum(g / math.log2(rank + 2) for rank, g in enumerate(ideal))
  first = next((rank for rank, g in enumerate(gains[:10]) if g >= 1), None)
  hits, precisions = 0, 0.0
  for rank, g in enumerate(gains):
    if g >= 1:
      hits += 1
      precisions += hits / (rank + 1)
  return {
      "ndcg@10": dcg / idcg if idcg > 0 else 0.0,
      "mrr@10": 1.0 / (first + 1) if first is not None else 0.0,
      "recall@100": (sum(1 for g in gains[:100] if g >= 1) / relevant_total
                     if relevant_total else 0.0),
      "map": precisions / relevant_total if relevant_total else 0.0,
  }


def evaluate(qrels: Qrels, run: Run) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
  """(mean of each metric over the run's queries with qrels, per-query metrics)."""
  per_query = {qid: query_metrics(qrels[qid], scores) for qid, scores in run.items()
               if qid in qrels}
  if not per_query:
    raise ValueError("no query of the run has relevance judgements (qrels)")
  means = {name: float(np.mean([m[name] for m in per_query.values()])) for name in METRICS}
  return means, per_query


def search(queries: np.ndarray, documents: np.ndarray, k: int,
           chunk: int = 1024) -> tuple[np.ndarray, np.ndarray]:
  """Exact search by inner product (cosine for normalised vectors): queries [Q, H], documents
  [D, H] -> (scores [Q, k'], indices [Q, k']) of the k' = min(k, D) best documents per query,
  best first (ties: the lower index first). Queries go `chunk` at a time: memory Q x D / chunk."""
  k = min(k, len(documents))
  documents = np.asarray(documents, np.float32)
  all_scores, all_indices = [], []
  for start in range(0, len(queries), chunk):
    scores = np.asarray(queries[start:start + chunk], np.float32) @ documents.T  # [q, D]
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k] if k < scores.shape[1] else (
        np.broadcast_to(np.arange(scores.shape[1]), scores.shape))
    top_scores = np.take_along_axis(scores, top, axis=1)
    order = np.lexsort((top, -top_scores), axis=1)  # Score descending, then index.
    all_indices.append(np.take_along_axis(top, order, axis=1))
    all_scores.append(np.take_along_axis(top_scores, order, axis=1))
  return np.concatenate(all_scores), np.concatenate(all_indices)


def run_from_search(query_ids, document_ids, scores: np.ndarray,
                    indices: np.ndarray) -> dict[str, dict[str, float]]:
  """A run from `search`'s arrays and the ids of its rows."""
  return {str(qid): {str(document_ids[j]): float(s) for j, s in zip(row_indices, row_scores)}
          for qid, row_indices, row_scores in zip(query_ids, indices, scores)}
