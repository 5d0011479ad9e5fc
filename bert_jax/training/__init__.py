"""The train loop and what it runs: trainer, compiled programs and pure steps, optimizers and
schedules, sharding, resume, evaluation, reporting, prefetch, preemption."""
