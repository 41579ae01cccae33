"""``python -m factkernels ...`` (and ``torchrun ... -m factkernels ...``): the command line."""

import sys

from .cli import main

sys.exit(main())
