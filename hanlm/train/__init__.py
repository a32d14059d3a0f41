"""Training: the loop, parallelism, precision, checkpoints, distillation and export."""
