"""``python -m pdsim.cli``: the ``pdsim`` command."""

import sys

from pdsim.cli.main import main

sys.exit(main())
