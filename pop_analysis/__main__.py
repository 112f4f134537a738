import sys

from pop_analysis.cli import main

sys.exit(main())
