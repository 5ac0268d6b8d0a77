import sys

from faultwatch.cli import main

sys.exit(main())
