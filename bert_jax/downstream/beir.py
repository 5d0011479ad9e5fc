"""Retrieval suites in BEIR's layout, zero-shot (`launch/downstream.py --suite=beir
--data_dir=DIR --checkpoint=MODEL --output_dir=OUT`): the embedding model encodes each task's
corpus and queries, exact search ranks the corpus for every query (`retrieval.search`, the top
100), and the run is scored as BEIR scores it (trec_eval's nDCG@10, MRR@10, recall@100, MAP:
`retrieval.evaluate`). One table, as GLUE's is reported.

A task is a directory with `corpus.jsonl` ({"_id", "title"?, "text"}), `queries.jsonl`
({"_id", "text"}) and `qrels/<split>.tsv` (query-id, corpus-id, score, with a header line), as
BEIR's downloads unpack (scifact, nfcorpus, fiqa, ...). --data_dir is one task, or holds tasks
as subdirectories (all of them, or those --tasks names). A document's text is its title and
text joined by a space, as BEIR's sentence-transformers models read it.

The model (`predict.load_embedding_model`): a bert_jax embedding run (its pooling, normalisation and
length), a sentence-transformers directory (its Pooling, Normalize and max_seq_length), or any
encoder `config.init_from` takes (pooling by `embedding.resolve_pooling`, normalised, its
position table's length up to 512).
"""

import csv
import dataclasses
import json
import os
from typing import Any, Sequence

import numpy as np

from bert_jax import predict
from bert_jax.downstream import retrieval
from bert_jax.runtime import storage

FILES = ("corpus.jsonl", "queries.jsonl")
TOP_K = 100  # Documents kept per query: recall@100's depth.


@dataclasses.dataclass
class BeirTask:
  name: str
  corpus: dict[str, str]  # Document id -> its text (title and text).
  queries: dict[str, str]  # Query id -> its text (only the queries with qrels).
  qrels: dict[str, dict[str, int]]


def _jsonl(path: str) -> list[tuple[int, dict[str, Any]]]:
  """(line number, record) of each non-blank line."""
  rows = []
  for number, raw in enumerate(storage.read_bytes(path).splitlines(), 1):
    try:
      line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
      raise ValueError(f"{path}, line {number}: not UTF-8 ({e.reason} at byte {e.start} of the "
                       "line)") from None
    if line.strip():
      try:
        rows.append((number, json.loads(line)))
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}, line {number}: not JSON ({e.msg})") from e
  return rows


def _texts(path: str, with_title: bool) -> dict[str, str]:
  """_id -> text (title and text joined by a space, as BEIR's models read them) of a
  corpus.jsonl or queries.jsonl; a record without them, or an _id given twice, is one line."""
  texts: dict[str, str] = {}
  first: dict[str, int] = {}
  for number, row in _jsonl(path):
    if not isinstance(row, dict) or "_id" not in row or not isinstance(row.get("text"), str):
      raise ValueError(f"{path}, line {number}: a record without '_id' and a 'text' string: "
                       f"{str(row)[:80]}")
    key = str(row["_id"])
    if key in first:
      raise ValueError(f"{path}, line {number}: _id {key!r} again (first on line {first[key]}): "
                       "ids must be unique")
    text = row["text"]
    if with_title and row.get("title"):
      text = f"{row['title']} {text}"
    if not text.strip():  # Else the model's refusal would name a list index, not this line.
      raise ValueError(f"{path}, line {number}: _id {key!r} has no text"
                       + (" (nor a title)" if with_title else ""))
    texts[key], first[key] = text, number
  return texts


def read_task(directory: str, split: str = "test") -> BeirTask:
  """One task in BEIR's layout; its queries are those with judgements in `split`."""
  missing = [f for f in (*FILES, f"qrels/{split}.tsv")
             if not storage.isfile(storage.join(directory, f))]
  if missing:
    raise ValueError(f"{directory}: not a task in BEIR's layout (missing {', '.join(missing)})")
  corpus_path, queries_path = (storage.join(directory, f) for f in FILES)
  corpus = _texts(corpus_path, True)
  queries = _texts(queries_path, False)
  qrels: dict[str, dict[str, int]] = {}
  qrels_path = storage.join(directory, "qrels", f"{split}.tsv")
  reader = csv.reader(storage.read_text(qrels_path).splitlines(), delimiter="\t")
  for number, row in enumerate(reader, 1):
    if number == 1 and row and not row[-1].lstrip("-").isdigit():
      continue  # The header.
    if len(row) != 3 or not row[2].lstrip("-").isdigit():
      raise ValueError(f"{qrels_path}, line {number}: expected query-id, corpus-id, score")
    qrels.setdefault(row[0], {})[row[1]] = int(row[2])
  unknown = sorted({d for judged in qrels.values() for d in judged} - set(corpus))[:3]
  if unknown:
    raise ValueError(f"{qrels_path}: judges documents the corpus lacks, e.g. {unknown}")
  strangers = sorted(set(qrels) - set(queries))
  if strangers:  # Scoring the rest would quietly leave these out of every mean.
    raise ValueError(f"{qrels_path}: judges {len(strangers)} of its {len(qrels)} queries that "
                     f"{queries_path} lacks, e.g. {strangers[:3]}")
  asked = {q: text for q, text in queries.items() if q in qrels}
  if not asked:
    raise ValueError(f"{directory}: no query of queries.jsonl has judgements in {qrels_path}")
  return BeirTask(os.path.basename(os.path.normpath(directory)), corpus, asked, qrels)


def find_tasks(data_dir: str, names: Sequence[str] = ()) -> list[str]:
  """The task directories of --data_dir: itself when it is one, else its subdirectories that
  are (those `names` gives, in that order)."""
  if storage.isfile(storage.join(data_dir, "corpus.jsonl")):
    return [data_dir]
  found = sorted(d for d in storage.listdir(data_dir)
                 if storage.isfile(storage.join(data_dir, d, "corpus.jsonl")))
  if names:
    unknown = [n for n in names if n not in found]
    if unknown:
      raise ValueError(f"--tasks: {unknown} not in {data_dir} (tasks there: {found})")
    found = list(names)
  if not found:
    raise ValueError(f"--data_dir={data_dir}: no task in BEIR's layout (corpus.jsonl, "
                     "queries.jsonl, qrels/test.tsv) there or in its subdirectories")
  return [storage.join(data_dir, d) for d in found]


def evaluate_task(model: predict.Finetuned, task: BeirTask,
                  batch_size: int = 64) -> dict[str, float]:
  """The task's metrics (retrieval.METRICS), and its sizes."""
  doc_ids, query_ids = list(task.corpus), list(task.queries)
  documents = predict.embed(model, [task.corpus[d] for d in doc_ids], batch_size)
  queries = predict.embed(model, [task.queries[q] for q in query_ids], batch_size)
  scores, indices = retrieval.search(queries, documents, TOP_K)
  run = retrieval.run_from_search(query_ids, doc_ids, scores, indices)
  means, _ = retrieval.evaluate(task.qrels, run)
  return {**means, "queries": len(query_ids), "documents": len(doc_ids)}


def markdown(checkpoint: str, results: dict[str, dict[str, float]]) -> str:
  lines = [f"Zero-shot retrieval of {checkpoint} (x 100; top {TOP_K} of exact search)", "",
           "| task | nDCG@10 | MRR@10 | recall@100 | MAP | queries | documents |",
           "|---|---|---|---|---|---|---|"]
  for name, m in results.items():
    lines.append(f"| {name} | {100 * m['ndcg@10']:.1f} | {100 * m['mrr@10']:.1f} | "
                 f"{100 * m['recall@100']:.1f} | {100 * m['map']:.1f} | {m['queries']} | "
                 f"{m['documents']} |")
  if len(results) > 1:
    average = np.mean([m["ndcg@10"] for m in results.values()])
    lines.append(f"| average | {100 * average:.1f} | | | | | |")
  return "\n".join(lines) + "\n"


def run(checkpoint: str, data_dir: str, output_dir: str, names: Sequence[str] = (),
        split: str = "test", batch_size: int = 64) -> dict[str, dict[str, float]]:
  """Every task of `data_dir` (or those `names` gives): results.json and results.md in
  `output_dir`; -> task name -> metrics."""
  directories = find_tasks(data_dir, names)
  beir_tasks = [read_task(d, split) for d in directories]  # Every file checked first.
  model = predict.load_embedding_model(checkpoint)
  results = {}
  for task in beir_tasks:
    results[task.name] = evaluate_task(model, task, batch_size)
    print(f"{task.name}: nDCG@10 {results[task.name]['ndcg@10']:.4f} over "
          f"{results[task.name]['queries']} queries", flush=True)
  storage.makedirs(output_dir)
  storage.write_text(storage.join(output_dir, "results.json"),
                     json.dumps({"checkpoint": checkpoint, "split": split, "tasks": results},
                                indent=2))
  table = markdown(checkpoint, results)
  storage.write_text(storage.join(output_dir, "results.md"), table)
  print(table, flush=True)
  return results

