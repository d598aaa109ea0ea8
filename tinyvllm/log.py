"""Where the engine's progress lines go by default."""
import sys


def log_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
