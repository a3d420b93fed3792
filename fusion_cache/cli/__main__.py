"""`python -m fusion_cache.cli`, the same as the `fusion-cache` entry point."""
import sys

from .main import main

sys.exit(main())
