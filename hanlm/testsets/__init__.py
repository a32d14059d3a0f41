"""Benchmark items read from the files users have (KoBEST, GSM8K-ko, IFEval-ko, the demo's):
shared by decontamination and evaluation, so both see the same items with the same ids."""
