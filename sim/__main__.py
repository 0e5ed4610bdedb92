"""``python -m sim`` is the same as the ``trainsim`` command."""

from sim.cli import main

raise SystemExit(main())
