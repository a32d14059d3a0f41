"""The pipeline's stages, one module each: `run(cfg, run, *, force)` fingerprints the stage's
inputs, skips it when its outputs are complete, calls the libraries with explicit paths from the
`RunDir`, writes atomically and returns what it did."""
