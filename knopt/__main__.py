"""`python -m knopt`: the `knopt` command line."""

import sys

from knopt.cli import main

sys.exit(main())
