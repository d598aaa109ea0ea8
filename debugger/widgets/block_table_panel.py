"""Block tables: the KV pool as a grid of blocks, and each sequence's logical -> physical block ids.

Grid cells are block ids coloured by state (free, used, shared by two or more sequences through the
prefix cache, cached: free but still reusable by a prefix hit); `+` marks a block the current step
allocated, `-` one it freed.
"""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from ..session import BlockView

STATE_STYLES = {"free": "grey50", "used": "bold white on dark_green", "shared": "bold white on blue",
                "cached": "black on yellow"}
MAX_GRID_BLOCKS = 1024


def describe_blocks(blocks: BlockView, per_row: int = 12) -> Text:
    states = blocks.states
    count = {s: states.count(s) for s in STATE_STYLES}
    referenced = count["used"] + count["shared"]
    text = Text()
    text.append(f"KV pool {blocks.num_blocks} blocks x {blocks.block_size} tokens · usage {referenced}/"
                f"{blocks.num_blocks} ({100 * blocks.usage:.1f}%) · shared {count['shared']} · "
                f"cached {count['cached']} · free {count['free']} · prefix hits "
                f"{100 * blocks.prefix_hit_rate:.1f}%\n")
    for state, style in STATE_STYLES.items():
        text.append(f" {state} ", style=style)
        text.append(" ")
    text.append(" +allocated  -freed (this step)\n")
    shown = min(blocks.num_blocks, MAX_GRID_BLOCKS)
    width = len(str(blocks.num_blocks - 1))
    for i in range(shown):
        mark = "+" if i in blocks.just_allocated else "-" if i in blocks.just_freed else " "
        text.append(f"{i:>{width}}{mark}", style=STATE_STYLES[states[i]])
        text.append("\n" if (i + 1) % per_row == 0 or i == shown - 1 else " ")
    if shown < blocks.num_blocks:
        text.append(f"... {blocks.num_blocks - shown} more blocks\n")
    text.append("block tables (logical -> physical, * shared):\n")
    if not blocks.tables:
        text.append("  no sequence holds blocks\n", style="dim")
    for request_id, table in blocks.tables:
        cells = " ".join(f"{logical}→{physical}{'*' if blocks.ref_counts[physical] > 1 else ''}"
                         for logical, physical in enumerate(table))
        text.append(f"  req {request_id}: {cells}\n")
    return text


class BlockTablePanel(VerticalScroll):
    def compose(self) -> ComposeResult:
        yield Static(id="blocks-text")

    def on_mount(self) -> None:
        self.border_title = "KV blocks"

    def show(self, blocks: BlockView) -> None:
        cell = len(str(blocks.num_blocks - 1)) + 2
        per_row = max(4, (self.size.width - 4) // cell) if self.size.width else 12
        self.query_one("#blocks-text", Static).update(describe_blocks(blocks, per_row))
