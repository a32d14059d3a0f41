"""Before renting GPUs: memory, time and cost of a run (estimate), the GPU catalogue, the printed
table, and one training step traced on fake tensors to check the memory model (memtrace)."""
