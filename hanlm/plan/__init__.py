"""Before renting GPUs: memory (memory_model), time and cost (time_model) of a setup (inputs), the
plan that compares them (estimate) and a recipe's plan (recipe), the GPU catalogue, the data
stages' rates and the printed table (hanlm.train.memtrace traces one training step on fake
tensors to check the memory model)."""
