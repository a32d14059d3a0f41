"""`hanlm launch`: a recipe onto rented GPUs through an existing engine (SkyPilot or Slurm), and
`hanlm torchrun`, the torchrun whose exit status those engines act on."""
