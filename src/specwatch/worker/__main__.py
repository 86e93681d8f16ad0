"""``python -m specwatch.worker SPEC.json``: the child process the runner starts for one engine group."""

import sys

from specwatch.worker.main import main

sys.exit(main(sys.argv[1], child=True))
