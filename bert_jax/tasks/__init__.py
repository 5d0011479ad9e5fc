"""Training tasks on the one trainer: pretraining (MLM + NSP; replaced-token detection, RtdTask)
and the fine-tuning tasks, each in
its own module behind the interface of `tasks.base.Task`. Fine-tuning tasks are looked up by
name here (config.task) and by prediction mode (launch/predict.py --mode), once; nothing else
branches on a task's name. A task defined elsewhere (a user's module, a test) joins with
`register`."""

from bert_jax.tasks.base import Scores, Task
from bert_jax.tasks.classification import ClassificationTask
from bert_jax.tasks.diffusion_sft import DiffusionSftTask
from bert_jax.tasks.embedding import EmbeddingTask
from bert_jax.tasks.finetuning import ENCODER, HEAD_KINDS, FinetuneSettings, FinetuneTask
from bert_jax.tasks.pretraining import PretrainingTask
from bert_jax.tasks.qa import QATask
from bert_jax.tasks.rtd import RtdTask
from bert_jax.tasks.tagging import TaggingTask

FINETUNE_TASKS: dict[str, type[FinetuneTask]] = {
    task.name: task for task in (ClassificationTask, TaggingTask, QATask, EmbeddingTask,
                                 DiffusionSftTask)}


def register(task: type[FinetuneTask]) -> type[FinetuneTask]:
  """Adds a fine-tuning task class (its `name` and `predict_mode` unused so far)."""
  taken = {t.predict_mode: name for name, t in FINETUNE_TASKS.items()}
  if task.name in FINETUNE_TASKS or task.predict_mode in taken or task.predict_mode == "fill_mask":
    raise ValueError(f"A fine-tuning task named {task.name!r} or predicting as "
                     f"--mode={task.predict_mode} is registered already")
  FINETUNE_TASKS[task.name] = task
  return task


def finetune_task(name: str) -> type[FinetuneTask]:
  """The fine-tuning task class of `name` (config.task)."""
  if name not in FINETUNE_TASKS:
    raise ValueError(f"config.task={name!r}: use one of {sorted(FINETUNE_TASKS)}")
  return FINETUNE_TASKS[name]


def predict_modes() -> dict[str, type[FinetuneTask]]:
  """launch/predict.py's --mode -> the task it predicts with."""
  return {task.predict_mode: task for task in FINETUNE_TASKS.values()}


__all__ = ["ENCODER", "FINETUNE_TASKS", "HEAD_KINDS", "ClassificationTask", "DiffusionSftTask",
           "EmbeddingTask",
           "FinetuneSettings",
           "FinetuneTask", "PretrainingTask", "QATask", "RtdTask", "Scores", "TaggingTask", "Task",
           "finetune_task", "predict_modes", "register"]
