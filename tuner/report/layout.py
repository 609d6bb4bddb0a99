"""What makes a drawn chart unreadable: texts over texts, legends over curves (`layout_problems`).

Kept apart from the charts (`tuner.report.plots`) so that the check can be run on any matplotlib figure:
the report's charts and the fleet's timeline are drawn with it on in the tests.
"""

from __future__ import annotations

import math

import numpy as np


def _drawn_texts(fig) -> list:
    """The texts a chart shows: titles, axis labels, the tick labels of ticks inside each axis's view,
    texts and annotations, legend entries (matplotlib keeps Text objects for ticks it does not draw)."""
    out = [t for t in [fig._suptitle, *fig.texts] if t is not None]
    for ax in fig.axes:
        out += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            pad = 1e-9 * max(abs(hi - lo), 1e-300)
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                loc = tick.get_loc()
                if loc is not None and lo - pad <= loc <= hi + pad:
                    out += [tick.label1, tick.label2]
    for lg in list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]:
        out += list(lg.get_texts())
    unique = list({id(t): t for t in out}.values())  # the suptitle is among the figure's texts too
    return [t for t in unique if t.get_visible() and t.get_text().strip()]


def _quad(t, renderer) -> np.ndarray:
    """A text's box turned as the text is (four corners, display pixels). Its window extent is the upright
    box around it, which calls two neighbouring slanted tick labels overlapping where their letters are
    well apart; the turned box is the upright text's box turned about the extent's centre."""
    box = t.get_window_extent(renderer)
    corners = np.array([[box.x0, box.y0], [box.x1, box.y0], [box.x1, box.y1], [box.x0, box.y1]])
    angle = t.get_rotation()
    if angle % 90 == 0:
        return corners
    t.set_rotation(0)
    flat = t.get_window_extent(renderer)
    t.set_rotation(angle)
    c, s = math.cos(math.radians(angle)), math.sin(math.radians(angle))
    w, h = flat.width / 2, flat.height / 2
    local = np.array([[-w, -h], [w, -h], [w, h], [-w, h]])
    return local @ np.array([[c, s], [-s, c]]) + corners.mean(axis=0)


def _meet(a: np.ndarray, b: np.ndarray, tol: float = 1.0) -> bool:
    """Two convex boxes overlap by more than `tol` pixels: no edge's normal separates them."""
    for quad in (a, b):
        for i in range(4):
            edge = quad[(i + 1) % 4] - quad[i]
            if not edge.any():
                continue
            n = np.array([-edge[1], edge[0]]) / np.hypot(*edge)
            pa, pb = a @ n, b @ n
            if min(pa.max(), pb.max()) - max(pa.min(), pb.min()) <= tol:
                return False
    return True


def layout_problems(fig) -> list[str]:
    """Texts that overlap each other, and curves drawn under a legend, in the figure as drawn: what makes a
    chart unreadable at the report's width (the issue found an axis label over the next panel, tick labels
    over an axis title, legends over the curves)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    name = fig._suptitle.get_text() if fig._suptitle is not None else "a chart"
    boxes = [(t.get_text(), _quad(t, renderer)) for t in _drawn_texts(fig)]
    out = []
    for i, (a, qa) in enumerate(boxes):
        for b, qb in boxes[i + 1:]:
            if _meet(qa, qb):
                out.append(f"{name}: {a!r} overlaps {b!r}")
    for lg in list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]:
        box = lg.get_window_extent(renderer)
        for ax in fig.axes:
            for line in ax.get_lines():
                path = line.get_transform().transform_path(line.get_path())
                if len(path.vertices) and path.intersects_bbox(box, filled=False):
                    out.append(f"{name}: the legend covers {line.get_label()!r}")
    return out
