"""Task suites: the paper's eight benchmarks and the offline task, with the metric reported for each.

The paper reports "accuracy" per task. We report lm-eval's length-normalised `acc_norm` where
lm-eval defines it and the answer choices differ in length (ARC-Challenge, ARC-Easy, HellaSwag,
OpenBookQA, PIQA): raw log-likelihood would favour short answers there. SciQ's choices are short
entities, so plain `acc`; Social IQA and WinoGrande define only `acc` (WinoGrande scores the
shared suffix under two contexts, so no length bias arises).
"""

PAPER_TASKS = ("arc_challenge", "arc_easy", "hellaswag", "openbookqa", "piqa", "sciq", "social_iqa", "winogrande")
OFFLINE_TASK = "ddl_continuation"

REPORTED_METRIC = {
    "arc_challenge": "acc_norm", "arc_easy": "acc_norm", "hellaswag": "acc_norm", "openbookqa": "acc_norm",
    "piqa": "acc_norm", "sciq": "acc", "social_iqa": "acc", "winogrande": "acc", OFFLINE_TASK: "acc",
}


def reported_metric(task: str) -> str:
    return REPORTED_METRIC.get(task, "acc")
