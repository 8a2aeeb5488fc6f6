import sys

from selfsup.cli import main

sys.exit(main())
