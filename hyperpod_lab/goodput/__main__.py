"""``python -m hyperpod_lab.goodput --table``."""

import sys

from hyperpod_lab.goodput.figures import main

sys.exit(main())
