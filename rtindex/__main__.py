import sys

from rtindex.cli import main

sys.exit(main())
