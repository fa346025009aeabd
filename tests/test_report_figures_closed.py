"""The HTML report's figures are closed once rendered: pyplot keeps every open figure, so a
report built for each point of a sweep in one process would otherwise hold them all."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from simulator.report.figure import new_figure, png_bytes_closed  # noqa: E402


def test_png_bytes_closed_renders_a_png_and_leaves_no_figure_open():
    before = len(plt.get_fignums())
    fig = new_figure(200, 100)
    fig.add_subplot(1, 1, 1).plot([0, 1], [1, 0])
    data = png_bytes_closed(fig)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(plt.get_fignums()) == before


def test_png_bytes_closed_is_deterministic():
    def draw():
        fig = new_figure(200, 100)
        fig.add_subplot(1, 1, 1).bar([0, 1, 2], [3, 1, 2])
        return png_bytes_closed(fig)

    assert draw() == draw()
