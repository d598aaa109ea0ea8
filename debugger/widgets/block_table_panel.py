"""Block tables: the KV pool as a grid of blocks, and each sequence's logical -> physical block ids.

Grid cells are block ids coloured by state (free, used, shared by two or more sequences through the
prefix cache, cached: free but still reusable by a prefix hit); `+` marks a block the current step
allocated, `-` one it freed. Below WIDE_COLUMNS columns the summary is one line and the cells lose their
spacing (the mark column still separates them), so the grid of the debugger's 64-block pool fits at 100 x 30.
"""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from debugger.session import BlockView

STATE_STYLES = {"free": "grey50", "used": "bold white on dark_green", "shared": "bold white on blue",
                "cached": "black on yellow"}
MAX_GRID_BLOCKS = 1024
WIDE_COLUMNS = 56


def describe_blocks(blocks: BlockView, per_row: int = 12, compact: bool = False) -> Text:
    states = blocks.states
    count = {s: states.count(s) for s in STATE_STYLES}
    referenced = count["used"] + count["shared"]
    text = Text()
    if compact:
        text.append(f"used {referenced}/{blocks.num_blocks} · shared {count['shared']} · cached {count['cached']} "
                    f"· hits {100 * blocks.prefix_hit_rate:.0f}%\n")
    else:
        text.append(f"KV pool {blocks.num_blocks} blocks x {blocks.block_size} tokens · usage {referenced}/"
                    f"{blocks.num_blocks} ({100 * blocks.usage:.1f}%) · shared "
                    f"{count['shared']} · cached {count['cached']} · free {count['free']} · prefix hits "
                    f"{100 * blocks.prefix_hit_rate:.1f}%\n")
    for state, style in STATE_STYLES.items():
        text.append(f" {state} ", style=style)
        text.append(" ")
    text.append(" +new -freed\n" if compact else " +allocated  -freed (this step)\n")
    shown = min(blocks.num_blocks, MAX_GRID_BLOCKS)
    width = len(str(blocks.num_blocks - 1))
    for i in range(shown):
        mark = "+" if i in blocks.just_allocated else "-" if i in blocks.just_freed else " "
        text.append(f"{i:>{width}}{mark}", style=STATE_STYLES[states[i]])
        if (i + 1) % per_row == 0 or i == shown - 1:
            text.append("\n")
        elif not compact:
            text.append(" ")
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
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.blocks: BlockView | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="blocks-text")

    def on_mount(self) -> None:
        self.border_title = "KV blocks"

    def on_resize(self) -> None:
        if self.blocks is not None:
            self.show(self.blocks)

    def show(self, blocks: BlockView) -> None:
        self.blocks = blocks
        width = self.size.width - 2   # a vertical scrollbar may take 2
        compact = 0 < width < WIDE_COLUMNS
        self.border_title = f"KV blocks · {blocks.num_blocks} x {blocks.block_size} tokens"
        cell = len(str(blocks.num_blocks - 1)) + (1 if compact else 2)
        per_row = max(4, width // cell) if width > 0 else 12
        self.query_one("#blocks-text", Static).update(describe_blocks(blocks, per_row, compact))
