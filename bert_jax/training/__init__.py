"""The train loop and what it runs: trainer, compiled programs and steps, optimizers and schedules, sharding, resume, evaluation, reporting."""
