"""Evaluation: benchmark readers (shared with decontamination), tasks, harness and the eval stage."""
