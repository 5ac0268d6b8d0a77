from faultwatch.cli import main
import sys
sys.exit(main())
