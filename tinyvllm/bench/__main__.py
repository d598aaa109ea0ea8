"""python -m tinyvllm.bench: the same as `tinyvllm bench`."""
import sys

from tinyvllm.cli import main

sys.exit(main(["bench", *sys.argv[1:]]))
