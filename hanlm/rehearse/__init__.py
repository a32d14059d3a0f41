"""`hanlm rehearse`: every stage of a recipe on the host it will run on, with its real shapes
and small budgets, before the run is paid for (run.py); its recipe (recipe.py), each stage's
figures (figures.py), the stop-and-resume check (resume.py), one request to `hanlm serve`
(serving.py) and `--tune` (tune.py)."""
