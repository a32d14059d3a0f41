"""Sharing a trained model where people run and find small models: GGUF files for llama.cpp and
Ollama, a Hugging Face Hub repository with a model card built from the run."""
