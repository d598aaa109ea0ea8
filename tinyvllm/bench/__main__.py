"""python -m tinyvllm.bench: the same as `tinyvllm bench`."""
import sys

from tinyvllm.bench import main

sys.exit(main())
