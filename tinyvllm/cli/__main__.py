"""python -m tinyvllm.cli: the same as `tinyvllm`."""
import sys

from tinyvllm.cli import main

sys.exit(main())
