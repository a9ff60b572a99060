"""``python -m ludic.cli ...`` runs the ``ludic`` command line."""

import sys

from ludic.cli import main

if __name__ == "__main__":
    sys.exit(main())
