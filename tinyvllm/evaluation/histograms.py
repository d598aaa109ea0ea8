"""Token-length histograms of a task's full set and of the evaluated subset: a text table and a PNG.

Bins double in width (0-63, 64-127, ... up to the context cap) and a last bin holds what does not fit, so
the two distributions can be compared at a glance and the too-long prompts are visible. The PNG needs
matplotlib; without it the text table is all (and the caller says so).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np


def length_edges(cap: int, first: int = 64) -> list[int]:
    """Bin edges 0, first, 2 first, ... below cap, then cap + 1: the last bin that fits ends at cap, and the
    bin after it (see `histogram`) holds every length over the cap."""
    edges, edge = [0], first
    while edge <= cap:
        edges.append(edge)
        edge *= 2
    if edges[-1] == cap:
        edges.pop()
    return edges + [cap + 1]


def histogram(lengths: list[int], edges: list[int]) -> list[int]:
    """Counts per bin [edges[i], edges[i+1]), and a last bin for lengths >= edges[-1]."""
    counts = np.histogram(np.asarray(lengths, dtype=np.int64), bins=[*edges, np.iinfo(np.int64).max])[0]
    return [int(c) for c in counts]


def bin_labels(edges: list[int]) -> list[str]:
    return [f"{lo}-{hi - 1}" for lo, hi in zip(edges, edges[1:])] + [f">={edges[-1]}"]


def format_histograms(title: str, edges: list[int], columns: dict[str, list[int]], bar_width: int = 20) -> str:
    """A text table: one row per bin, for each column its count, share and a bar."""
    labels = bin_labels(edges)
    header = f"  {title:<14}" + "".join(f"{name:>{14 + bar_width}}" for name in columns)
    rows = [header]
    for b, label in enumerate(labels):
        cells = []
        for counts in columns.values():
            total = sum(counts) or 1
            share = counts[b] / total
            cells.append(f"{counts[b]:>7} {100 * share:5.1f} % {'#' * round(share * bar_width):<{bar_width}}")
        rows.append(f"  {label:<14}" + "".join(f"{c:>{14 + bar_width}}" for c in cells))
    return "\n".join(rows)


def plot_histograms(path: Path, panels: list[tuple[str, list[int], dict[str, list[int]]]]) -> bool:
    """Write a PNG with one bar chart per (title, edges, {name: counts}) panel, as shares of each column;
    False (nothing written) when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4.5), squeeze=False)
    for ax, (title, edges, columns) in zip(axes[0], panels):
        labels = bin_labels(edges)
        x = np.arange(len(labels))
        width = 0.8 / len(columns)
        for k, (name, counts) in enumerate(columns.items()):
            shares = np.asarray(counts, dtype=float) / max(sum(counts), 1)
            ax.bar(x + k * width, shares, width, label=f"{name} (n={sum(counts)})")
        ax.set_title(title)
        ax.set_ylabel("share of questions")
        ax.set_xticks(x + width * (len(columns) - 1) / 2)
        ax.set_xticklabels(labels, rotation=45, ha="right")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
