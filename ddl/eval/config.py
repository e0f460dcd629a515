"""What to evaluate after training (conf/eval/*.yaml), checked before anything trains. No lm_eval here."""

from __future__ import annotations

from dataclasses import dataclass

from ..validation import failure, is_int

_fail = failure("eval")


@dataclass(frozen=True)
class EvalConfig:
    tasks: tuple[str, ...] = ()          # lm-eval task names (the paper's, or the offline ddl_continuation)
    shots: tuple[int, ...] = ()          # few-shot counts, each task evaluated at each
    batch_size: int = 16
    limit: int | None = None             # at most this many items per task (smoke checks)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", tuple(self.tasks))
        object.__setattr__(self, "shots", tuple(self.shots))
        for task in self.tasks:
            if not isinstance(task, str) or not task:
                _fail("tasks", list(self.tasks), "must be a list of lm-eval task names")
        if self.tasks and not self.shots:
            _fail("shots", [], "must list at least one shot count when eval.tasks is set, e.g. [0]")
        if not all(is_int(s) and s >= 0 for s in self.shots):
            _fail("shots", list(self.shots), "must be a list of integers >= 0")
        if not is_int(self.batch_size) or self.batch_size < 1:
            _fail("batch_size", self.batch_size, "must be an integer >= 1")
        if self.limit is not None and (not is_int(self.limit) or self.limit < 1):
            _fail("limit", self.limit, "must be null or an integer >= 1")

    def evaluations(self) -> list[str]:
        """Each (task, shots) pair as 'task@shots': what a finished run must hold to count as done."""
        return sorted(f"{task}@{shots}" for task in self.tasks for shots in self.shots)
