import sys

from bench.starts import main

sys.exit(main())
