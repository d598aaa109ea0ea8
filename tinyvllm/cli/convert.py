"""`tinyvllm convert IN.gguf OUT_DIR`: the command line of tinyvllm/model/gguf/convert.py."""
from __future__ import annotations

import sys

from tinyvllm.model.gguf import convert

DESCRIPTION = convert.__doc__


def add_arguments(p) -> None:
    p.add_argument("gguf", metavar="IN.gguf", help="a .gguf file, or a directory holding exactly one")
    p.add_argument("out_dir", metavar="OUT_DIR",
                   help="directory to write the HF model into (created if missing; must be empty unless --force)")
    p.add_argument("--force", action="store_true",
                   help="write into an existing non-empty OUT_DIR, replacing the files convert writes there")


def run(args) -> int:
    convert.convert(args.gguf, args.out_dir, log=lambda message: print(message, file=sys.stderr),
                    force=args.force)
    return 0
