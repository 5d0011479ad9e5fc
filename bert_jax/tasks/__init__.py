"""Training tasks on the one trainer: pretraining (MLM + NSP) and the fine-tuning tasks, each in
its own module behind the interface of `tasks.base.Task`. Fine-tuning tasks are looked up by
name here, once; nothing else branches on a task's name."""

from bert_jax.tasks.base import Task
from bert_jax.tasks.classification import ClassificationTask
from bert_jax.tasks.finetuning import ENCODER, FinetuneSettings, FinetuneTask
from bert_jax.tasks.pretraining import PretrainingTask
from bert_jax.tasks.qa import QATask
from bert_jax.tasks.tagging import TaggingTask

FINETUNE_TASKS: dict[str, type[FinetuneTask]] = {
    task.name: task for task in (ClassificationTask, TaggingTask, QATask)}


def finetune_task(name: str) -> type[FinetuneTask]:
  """The fine-tuning task class of `name` ("classification", "tagging" or "qa")."""
  if name not in FINETUNE_TASKS:
    raise ValueError(f"config.task={name!r}: use one of {sorted(FINETUNE_TASKS)}")
  return FINETUNE_TASKS[name]


__all__ = ["ENCODER", "FINETUNE_TASKS", "ClassificationTask", "FinetuneSettings",
           "FinetuneTask", "PretrainingTask", "QATask", "TaggingTask", "Task", "finetune_task"]
