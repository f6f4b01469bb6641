"""berth's IPython extension for the code-interpreter's Python kernel.

Loaded at kernel start (the kernelspec passes ``--ext=berth_kernel``). It adds two
display formatters whose MIME types berth-interpreter maps to the SDKs' ``Result``
fields:

- ``e2b/chart``: for a matplotlib ``Figure``, its structure — chart type, title, axis
  labels, units, scales, ticks and the plotted elements — in the shape of the SDK's
  ``charts`` models (line, scatter, bar, pie, box-and-whisker, superchart, unknown).
- ``e2b/data``: for a pandas ``DataFrame``, its columns as lists (JSON-safe).

It also turns off colours in tracebacks and the truncation of long sequences in the
plain-text repr. Nothing is imported into the user's namespace, pandas is only touched
once the user's code has imported it; matplotlib.axes is imported at load so box plots
can be recorded as they are drawn.
"""

import datetime
import math
import re
import sys

from IPython.core.formatters import BaseFormatter
from traitlets import ObjectName, Unicode

CHART_MIME = "e2b/chart"
DATA_MIME = "e2b/data"

# "Time (s)" or "Length [m]" -> the unit inside the brackets.
_UNIT = re.compile(r"\s\(([^()]*)\)|\[([^\[\]]*)\]")
_DEFAULT_LABEL = re.compile(r"^_(?:child|container)(\d+)$")


# --- JSON-safe values ----------------------------------------------------------------


def _number(value):
    """A float for JSON: NaN and infinities have no JSON form and become None."""
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        return None
    return value


def _round(value, digits=10):
    """Drops float noise (324.00000000000006 -> 324.0) from derived values."""
    value = _number(value)
    if value is None or value == 0:
        return value
    return float(f"{value:.{digits}g}")


def _cell(value):
    """A value as JSON: dates as ISO strings, NaN as null, numpy scalars unwrapped."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        if isinstance(value, numpy.datetime64):
            return None if numpy.isnat(value) else str(value.astype("datetime64[s]"))
        if isinstance(value, numpy.generic):
            value = value.item()
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    pandas = sys.modules.get("pandas")
    if pandas is not None and value is pandas.NaT:
        return None
    return str(value)


def _point(value):
    """A chart coordinate: numbers as floats (as the SDK's models expect), dates as
    ISO strings, categories as text."""
    value = _cell(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _number(value)
    return value


# --- axes ----------------------------------------------------------------------------


def _label(text):
    return text or None


def _unit(label):
    if not label:
        return None
    match = _UNIT.search(label)
    if not match:
        return None
    return match.group(1) if match.group(1) is not None else match.group(2)


def _is_date_axis(axis):
    import matplotlib.dates as mdates

    formatter = axis.get_major_formatter()
    return isinstance(
        formatter, (mdates.DateFormatter, mdates.AutoDateFormatter, mdates.ConciseDateFormatter)
    )


def _is_categorical_axis(axis):
    import matplotlib.category as mcategory

    return isinstance(axis.get_units(), mcategory.UnitData)


def _scale(axes, axis, name):
    if _is_date_axis(axis):
        return "datetime"
    if _is_categorical_axis(axis):
        return "categorical"
    scale = axes.get_xscale() if name == "x" else axes.get_yscale()
    return scale


def _ticks(axis):
    """Tick positions (ISO strings on date axes) and their labels as drawn."""
    import matplotlib.dates as mdates

    positions = [float(tick) for tick in axis.get_majorticklocs()]
    labels = [str(text) for text in axis.get_major_formatter().format_ticks(positions)]
    if _is_date_axis(axis):
        ticks = [mdates.num2date(tick).isoformat() for tick in positions]
    else:
        ticks = [_number(tick) for tick in positions]
    return ticks, labels, positions


def _series_label(label, kind, index):
    match = _DEFAULT_LABEL.match(label or "")
    if match or not label:
        number = int(match.group(1)) if match else index
        return f"{kind} {number}"
    return label


def _base(axes, chart_type):
    return {"type": chart_type, "title": _label(axes.get_title()), "elements": []}


def _two_d(axes, chart_type, swap=False):
    chart = _base(axes, chart_type)
    x_label, y_label = _label(axes.get_xlabel()), _label(axes.get_ylabel())
    if swap:
        x_label, y_label = y_label, x_label
    chart.update(
        x_label=x_label, y_label=y_label, x_unit=_unit(x_label), y_unit=_unit(y_label)
    )
    return chart


def _point_chart(axes, chart_type):
    chart = _two_d(axes, chart_type)
    for name, axis in (("x", axes.xaxis), ("y", axes.yaxis)):
        ticks, labels, _ = _ticks(axis)
        chart[f"{name}_ticks"] = ticks
        chart[f"{name}_tick_labels"] = labels
        chart[f"{name}_scale"] = _scale(axes, axis, name)
    return chart


def _data_lines(axes):
    # axhline/axvline and friends live in axes coordinates on one side: not data.
    return [line for line in axes.lines if line.get_transform() == axes.transData]


def _line_chart(axes):
    chart = _point_chart(axes, "line")
    for index, line in enumerate(_data_lines(axes)):
        xs, ys = line.get_xdata(orig=True), line.get_ydata(orig=True)
        chart["elements"].append(
            {
                "label": _series_label(line.get_label(), "Line", index),
                "points": [[_point(x), _point(y)] for x, y in zip(xs, ys)],
            }
        )
    return chart


def _scatter_chart(axes):
    chart = _point_chart(axes, "scatter")
    for index, collection in enumerate(axes.collections):
        chart["elements"].append(
            {
                "label": _series_label(collection.get_label(), "Series", index),
                "points": [
                    [_point(x), _point(y)] for x, y in collection.get_offsets().tolist()
                ],
            }
        )
    return chart


def _category_at(position, ticks):
    """The tick label drawn at a bar's centre, else the position itself."""
    for tick, label in ticks:
        if math.isclose(tick, position, rel_tol=1e-9, abs_tol=1e-9):
            return label
    return f"{position:g}"


def _bar_chart(axes):
    from matplotlib.container import BarContainer

    containers = [c for c in axes.containers if isinstance(c, BarContainer)]
    horizontal = bool(containers) and all(c.orientation == "horizontal" for c in containers)
    # x_label always names the category axis, y_label the values.
    chart = _two_d(axes, "bar", swap=horizontal)
    category_axis = axes.yaxis if horizontal else axes.xaxis
    _, labels, positions = _ticks(category_axis)
    ticks = list(zip(positions, labels))
    for index, container in enumerate(containers):
        group = _series_label(container.get_label(), "Group", index)
        for rect, value in zip(container.patches, container.datavalues):
            if horizontal:
                centre = rect.get_y() + rect.get_height() / 2
            else:
                centre = rect.get_x() + rect.get_width() / 2
            chart["elements"].append(
                {"label": _category_at(centre, ticks), "group": group, "value": _number(value)}
            )
    return chart


def _pie_chart(axes):
    from matplotlib.patches import Wedge

    chart = _base(axes, "pie")
    for wedge in axes.patches:
        if isinstance(wedge, Wedge):
            chart["elements"].append(
                {
                    "label": wedge.get_label(),
                    "angle": _round(abs(wedge.theta2 - wedge.theta1)),
                    "radius": _number(wedge.r),
                }
            )
    return chart


def _live_boxplots(axes):
    """Box plots drawn on these axes and still there (the bxp hook records them)."""
    return [
        (stats, vertical)
        for stats, vertical, artists in getattr(axes, "_berth_boxplots", [])
        if any(line.axes is axes and line in axes.lines for line in artists.get("medians", []))
    ]


def _box_chart(axes, boxplots):
    vertical = all(vertical for _, vertical in boxplots)
    chart = _two_d(axes, "box_and_whisker", swap=not vertical)
    number = 0
    for stats_list, _ in boxplots:
        for stats in stats_list:
            number += 1
            label = stats.get("label")
            chart["elements"].append(
                {
                    "label": str(label) if label is not None else str(number),
                    "min": _number(stats["whislo"]),
                    "first_quartile": _number(stats["q1"]),
                    "median": _number(stats["med"]),
                    "third_quartile": _number(stats["q3"]),
                    "max": _number(stats["whishi"]),
                    "outliers": [_number(v) for v in stats.get("fliers", [])],
                }
            )
    return chart


def axes_chart(axes):
    """The chart one Axes shows, as the SDK's chart dict."""
    from matplotlib.collections import PathCollection
    from matplotlib.patches import Rectangle, Wedge

    boxplots = _live_boxplots(axes)
    if boxplots:
        return _box_chart(axes, boxplots)
    lines = _data_lines(axes)
    patches = list(axes.patches)
    collections = list(axes.collections)
    others = list(axes.images) + list(axes.artists)
    if others:
        return _base(axes, "unknown")
    if patches and all(isinstance(p, Wedge) for p in patches) and not collections:
        return _pie_chart(axes)
    if patches and axes.containers and all(isinstance(p, Rectangle) for p in patches):
        if not collections:
            return _bar_chart(axes)
    if collections and all(isinstance(c, PathCollection) for c in collections):
        if not patches and not lines:
            return _scatter_chart(axes)
    if lines and not patches and not collections:
        return _line_chart(axes)
    return _base(axes, "unknown")


def figure_chart(figure):
    """The chart a Figure shows: {} when it shows nothing, a superchart for several axes."""
    axes = figure.get_axes()
    if not any(ax.has_data() for ax in axes):
        return {}
    if len(axes) == 1:
        return axes_chart(axes[0])
    title = figure._suptitle.get_text() if getattr(figure, "_suptitle", None) else None
    return {
        "type": "superchart",
        "title": title or None,
        "elements": [axes_chart(ax) for ax in axes],
    }


def _record_boxplots():
    """Wraps Axes.bxp (which every box plot goes through) to keep its statistics."""
    from matplotlib.axes import Axes

    if getattr(Axes.bxp, "_berth_wrapped", False):
        return
    original = Axes.bxp

    def bxp(self, bxpstats, *args, **kwargs):
        artists = original(self, bxpstats, *args, **kwargs)
        orientation = kwargs.get("orientation")
        if orientation is None:
            vertical = kwargs.get("vert", True)
            vertical = True if vertical is None else bool(vertical)
        else:
            vertical = orientation == "vertical"
        recorded = getattr(self, "_berth_boxplots", [])
        recorded.append(([dict(stats) for stats in bxpstats], vertical, artists))
        self._berth_boxplots = recorded
        return artists

    bxp._berth_wrapped = True
    Axes.bxp = bxp


class ChartFormatter(BaseFormatter):
    format_type = Unicode(CHART_MIME)
    print_method = ObjectName("_repr_e2b_chart_")
    _return_type = (dict,)

    def __call__(self, obj):
        if "matplotlib" not in sys.modules:
            return super().__call__(obj)
        from matplotlib.figure import Figure

        if not isinstance(obj, Figure):
            return super().__call__(obj)
        try:
            return figure_chart(obj)
        except Exception as error:  # a chart we cannot read must not break the display
            print(f"berth: chart extraction failed: {error!r}", file=sys.__stderr__)
            return {}


class DataFormatter(BaseFormatter):
    format_type = Unicode(DATA_MIME)
    print_method = ObjectName("_repr_e2b_data_")
    _return_type = (dict,)

    def __call__(self, obj):
        pandas = sys.modules.get("pandas")
        if pandas is None or not isinstance(obj, pandas.DataFrame):
            return super().__call__(obj)
        columns = obj.to_dict(orient="list")
        return {str(name): [_cell(v) for v in values] for name, values in columns.items()}


def load_ipython_extension(ip):
    formatters = ip.display_formatter.formatters
    formatters[CHART_MIME] = ChartFormatter(parent=ip.display_formatter)
    formatters[DATA_MIME] = DataFormatter(parent=ip.display_formatter)
    ip.colors = "nocolor"
    ip.display_formatter.formatters["text/plain"].max_seq_length = 0
    # Box plots are recorded as they are drawn, so Axes.bxp is wrapped before any user
    # code runs (importing matplotlib.axes does not pick a backend or import pyplot).
    try:
        _record_boxplots()
    except ImportError:
        pass
