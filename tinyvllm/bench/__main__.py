"""python -m tinyvllm.bench: the same as `tinyvllm bench`."""
import sys

from . import main

sys.exit(main())
