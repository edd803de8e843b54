"""Entry point for ``python -m kubesim``."""

import sys

from kubesim.cli import main

sys.exit(main())
