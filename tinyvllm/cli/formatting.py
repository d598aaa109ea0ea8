"""How every `tinyvllm` parser shows its help: descriptions as written, each flag's default at the end."""
from __future__ import annotations

import argparse


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; each flag's help ends with its default, unless the help already speaks of
    it or there is none to show (None, a switch, an empty list)."""

    def _get_help_string(self, action):
        help = action.help or ""
        default = action.default
        if ("default" in help or default in (None, argparse.SUPPRESS, [], ()) or isinstance(default, bool)
                or not action.option_strings):
            return help
        shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else "%(default)s"
        return f"{help} (default: {shown})"


class CommandParser(argparse.ArgumentParser):
    """Every subcommand's parser shows defaults (HelpFormatter) unless it asks for another formatter."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def count(n: int, noun: str) -> str:
    """'1 token', '2 tokens': a count with its noun in the singular or plural."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
