"""An offline retrieval suite, built as the local suite is (`local_suite.installed_sources`: the
docstrings of numpy and scipy, parsed, never imported, files in sorted order), so nothing is
downloaded and the same installed files give the same bytes.

A query is a function's one-line summary ("Compute the arithmetic mean along the specified
axis."); its relevant document is the descriptions of that function's parameters, joined
("Input array. Axis along which the means are computed. ..."). The split is by source file
(`local_suite.validation_files`, 20%): a module's functions are all in train or all held out,
and a held-out query or document whose text is also in train is dropped. `build(output_dir)`
writes:
- `train.jsonl` and `validation.jsonl`: {"query", "positive"} records for the embedding task
  (`configs/finetune_embedding.py`; validation is scored by retrieval over its own documents);
- `beir/doc_search/`: the held-out split in BEIR's layout (corpus.jsonl, queries.jsonl,
  qrels/test.tsv), for `launch/downstream.py --suite=beir --data_dir=<output_dir>/beir`;
- `suite.json`: sizes and package versions.
"""

import json
from typing import Any

from bert_jax.data import local_suite
from bert_jax.runtime import storage

VERSION = 1
TASK = "doc_search"


def pairs(sources: list[local_suite.SourceFile]) -> dict[str, list[dict[str, str]]]:
  """{"train", "validation"}: (query, positive) records, split by source file; a text seen in
  train is not held out, and each held-out query and document appears once."""
  counts = {s.path: len(s.functions) for s in sources if s.functions}
  held_out = local_suite.validation_files(counts, 0.2)
  split: dict[str, list[dict[str, str]]] = {"train": [], "validation": []}
  seen: dict[str, set[str]] = {"train": set(), "validation": set()}
  for name in ("train", "validation"):  # Train first: its texts decide what is held out.
    for source in sources:
      if (source.path in held_out) != (name == "validation"):
        continue
      for summary, descriptions in source.functions:
        document = " ".join(descriptions.values())
        texts = {summary.lower(), document.lower()}
        if texts & seen[name] or (name == "validation" and texts & seen["train"]):
          continue
        seen[name] |= texts
        split[name].append({"query": summary, "positive": document})
  return split


def _write_jsonl(path: str, rows: list[dict[str, Any]]) -> None:
  storage.write_text(path, "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n"
                                   for r in rows))


def build(output_dir: str) -> dict[str, str]:
  """Writes the suite under `output_dir`; -> {"train_file", "validation_file", "beir_dir"}."""
  local_suite.claim_suite_dir(output_dir, ["train.jsonl", "validation.jsonl", "beir",
                                           local_suite.SUMMARY_FILE], "local_retrieval")
  split = pairs(local_suite.installed_sources())
  if not split["train"] or not split["validation"]:
    raise ValueError(f"the retrieval suite found no pairs in {local_suite.PACKAGES}' docstrings")
  storage.makedirs(output_dir)
  files = {"train_file": storage.join(output_dir, "train.jsonl"),
           "validation_file": storage.join(output_dir, "validation.jsonl"),
           "beir_dir": storage.join(output_dir, "beir")}
  _write_jsonl(files["train_file"], split["train"])
  _write_jsonl(files["validation_file"], split["validation"])
  task_dir = storage.join(files["beir_dir"], TASK)
  storage.makedirs(storage.join(task_dir, "qrels"))
  held_out = split["validation"]
  _write_jsonl(storage.join(task_dir, "corpus.jsonl"),
               [{"_id": f"d{i}", "text": r["positive"]} for i, r in enumerate(held_out)])
  _write_jsonl(storage.join(task_dir, "queries.jsonl"),
               [{"_id": f"q{i}", "text": r["query"]} for i, r in enumerate(held_out)])
  storage.write_text(storage.join(task_dir, "qrels", "test.tsv"),
                     "query-id\tcorpus-id\tscore\n"
                     + "".join(f"q{i}\td{i}\t1\n" for i in range(len(held_out))))
  summary = {"version": VERSION, "packages": local_suite._versions(local_suite.PACKAGES),  # pylint: disable=protected-access
             "train_pairs": len(split["train"]), "validation_pairs": len(held_out)}
  storage.write_text(storage.join(output_dir, local_suite.SUMMARY_FILE),
                     json.dumps(summary, indent=1, sort_keys=True) + "\n")
  return files
