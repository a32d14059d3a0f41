"""`python -m hanlm`: the form torchrun launches."""

from hanlm.cli import main

raise SystemExit(main())
