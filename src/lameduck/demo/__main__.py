"""`python -m lameduck.demo`: run the demo origin as its own process (tests, manual poking)."""

import sys

from .origin import main

if __name__ == "__main__":
    sys.exit(main())
