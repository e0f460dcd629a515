"""`ddl_continuation`: a real multiple-choice task from the embedded corpus' held-out split.

Each item is a 384-character passage from a held-out document, absent from the training text
(the manual repeats some passages; those are skipped), and four
64-character continuations: the true one and three taken at random offsets of other
held-out documents. Written as JSONL + an lm-eval task YAML over local files, so lm-eval runs a
genuine evaluation with no Hub. Deterministic: the same bytes every time.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from .. import paths
from ..data.config import VAL_FRACTION
from ..data.sources import embedded_documents, is_val
from .suites import OFFLINE_TASK

CONTEXT_CHARS, CHOICE_CHARS, N_CHOICES, SEED = 384, 64, 4, 1234


def build_items() -> list[dict]:
    docs = [d for d in embedded_documents() if is_val(d, VAL_FRACTION)]
    train_text = "\n".join(d for d in embedded_documents() if not is_val(d, VAL_FRACTION))
    span = CONTEXT_CHARS + CHOICE_CHARS
    rng = random.Random(SEED)
    items = []
    for i, doc in enumerate(docs):
        for start in range(0, len(doc) - span + 1, span):
            cut = start + CONTEXT_CHARS
            if doc[start:cut] in train_text:  # the manual repeats some passages across topics
                continue
            others = [docs[j] for j in rng.sample([j for j in range(len(docs)) if j != i], N_CHOICES - 1)]
            distractors = [d[p:p + CHOICE_CHARS] for d in others
                           for p in [rng.randrange(max(1, len(d) - CHOICE_CHARS + 1))]]
            choices = distractors + [doc[cut:cut + CHOICE_CHARS]]
            rng.shuffle(choices)
            items.append({"context": doc[start:cut], "choices": choices,
                          "label": choices.index(doc[cut:cut + CHOICE_CHARS])})
    return items


TASK_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: multiple_choice
test_split: test
doc_to_text: context
doc_to_choice: choices
doc_to_target: label
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def ensure_task_dir() -> Path:
    """DDL_HOME/eval_tasks: the offline task's JSONL and YAML (lm-eval's include_path)."""
    directory = paths.home() / "eval_tasks"
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / f"{OFFLINE_TASK}.jsonl"
    if not data.is_file():
        paths.write_atomic(data, "".join(json.dumps(item, sort_keys=True) + "\n" for item in build_items()))
    paths.write_atomic(directory / f"{OFFLINE_TASK}.yaml", TASK_YAML.format(task=OFFLINE_TASK, data=data))
    return directory
