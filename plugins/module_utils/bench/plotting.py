"""What every benchmark plot shares: matplotlib, imported only when a plot is drawn, and the palette.

Importing matplotlib here, not at the top of report.py or timeline.py, keeps them (and the verdicts)
importable where matplotlib is not installed; the report then says the plots were skipped.

Pure Python, no Ansible import.
"""
from __future__ import annotations

PALETTE = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display), with the report's style."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 110, "axes.spines.top": False, "axes.spines.right": False,
                         "axes.grid": True, "grid.alpha": 0.3, "font.size": 9})
    return plt
