"""``python -m frenzy_opt.cli``: the ``frenzy`` command."""

import sys

from frenzy_opt.cli import main

sys.exit(main())
