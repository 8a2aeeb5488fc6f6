import sys

from selfsup.commands.main import main

sys.exit(main())
