"""Data stages: corpus, tokenizer, shards, the loader and the demo world."""
