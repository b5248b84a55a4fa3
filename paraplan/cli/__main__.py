import sys

from paraplan.cli import main

sys.exit(main())
