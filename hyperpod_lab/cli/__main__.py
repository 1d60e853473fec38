"""``python -m hyperpod_lab.cli``: the ``hyperpod-lab`` command."""

import sys

from hyperpod_lab.cli.commands import main

sys.exit(main())
