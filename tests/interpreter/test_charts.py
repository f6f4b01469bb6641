"""Chart data from matplotlib figures, as the SDK's chart models read it."""

from __future__ import annotations

import datetime

from e2b_code_interpreter.charts import (
    BarChart,
    BoxAndWhiskerChart,
    ChartType,
    LineChart,
    PieChart,
    ScatterChart,
    SuperChart,
)


def chart_of(sandbox, code):
    execution = sandbox.run_code(code)
    assert execution.error is None, execution.error
    result = execution.results[0]
    assert result.png
    return result.chart


def test_line_chart_with_dates_and_units(sandbox):
    chart = chart_of(sandbox, """
import datetime, numpy as np, matplotlib.pyplot as plt
dates = [datetime.date(2023, 9, 1) + datetime.timedelta(days=i) for i in range(30)]
plt.figure()
plt.plot(dates, np.sin(np.arange(30)), label='sin')
plt.plot(dates, np.cos(np.arange(30)), label='cos')
plt.xlabel('Time (s)'); plt.ylabel('Amplitude [Hz]'); plt.title('Waves')
plt.show()
""")
    assert isinstance(chart, LineChart)
    assert chart.type == ChartType.LINE
    assert chart.title == "Waves"
    assert (chart.x_label, chart.x_unit, chart.y_unit) == ("Time (s)", "s", "Hz")
    assert chart.x_scale == "datetime" and chart.y_scale == "linear"
    datetime.datetime.fromisoformat(chart.x_ticks[0])
    assert all(isinstance(t, float) for t in chart.y_ticks)
    assert all(isinstance(t, str) for t in chart.y_tick_labels)
    assert [line.label for line in chart.elements] == ["sin", "cos"]
    assert len(chart.elements[0].points) == 30
    assert chart.elements[0].points[0][0] == "2023-09-01"


def test_log_and_categorical_scales(sandbox):
    chart = chart_of(sandbox, """
import numpy as np, matplotlib.pyplot as plt
plt.figure(); plt.plot([1, 2, 3], ['A', 'B', 'C']); plt.xscale('log'); plt.show()
""")
    assert chart.x_scale == "log" and chart.y_scale == "categorical"


def test_bar_chart(sandbox):
    chart = chart_of(sandbox, """
import matplotlib.pyplot as plt
plt.figure()
plt.bar(['Author A', 'Author B', 'Author C'], [100, 200, 300], label='Books Sold')
plt.xlabel('Authors'); plt.ylabel('Books'); plt.title('Sales')
plt.show()
""")
    assert isinstance(chart, BarChart)
    assert (chart.title, chart.x_label, chart.y_label) == ("Sales", "Authors", "Books")
    assert [b.label for b in chart.elements] == ["Author A", "Author B", "Author C"]
    assert [b.value for b in chart.elements] == [100, 200, 300]
    assert {b.group for b in chart.elements} == {"Books Sold"}


def test_scatter_chart(sandbox):
    chart = chart_of(sandbox, """
import matplotlib.pyplot as plt
plt.figure()
plt.scatter([1, 2, 3], [4, 5, 6], label='Dataset 1')
plt.scatter([1, 2], [3, 3], label='Dataset 2')
plt.xlabel('A'); plt.ylabel('B')
plt.show()
""")
    assert isinstance(chart, ScatterChart)
    assert chart.title is None
    assert [e.label for e in chart.elements] == ["Dataset 1", "Dataset 2"]
    assert chart.elements[0].points == [(1.0, 4.0), (2.0, 5.0), (3.0, 6.0)]


def test_pie_chart(sandbox):
    chart = chart_of(sandbox, """
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.pie([90, 10], labels=['No', 'No, in blue'], startangle=90)
plt.title('Will I wake up early?')
plt.show()
""")
    assert isinstance(chart, PieChart)
    assert chart.title == "Will I wake up early?"
    assert [(p.label, p.angle, p.radius) for p in chart.elements] == [("No", 324, 1), ("No, in blue", 36, 1)]


def test_box_and_whisker_chart(sandbox):
    chart = chart_of(sandbox, """
import matplotlib.pyplot as plt
data = {'Class A': [85, 90, 78, 92, 88], 'Class B': [95, 89, 76, 91, 84, 87], 'Class C': [75, 82, 88, 79, 86]}
fig, ax = plt.subplots()
ax.set_title('Exam Scores'); ax.set_xlabel('Class'); ax.set_ylabel('Score')
ax.boxplot(list(data.values()), tick_labels=list(data.keys()))
plt.show()
""")
    assert isinstance(chart, BoxAndWhiskerChart)
    assert (chart.title, chart.x_label, chart.y_label) == ("Exam Scores", "Class", "Score")
    boxes = chart.elements
    assert [b.label for b in boxes] == ["Class A", "Class B", "Class C"]
    assert [b.outliers for b in boxes] == [[], [76], []]
    assert [b.min for b in boxes] == [78, 84, 75]
    assert [b.first_quartile for b in boxes] == [85, 84.75, 79]
    assert [b.median for b in boxes] == [88, 88, 82]
    assert [b.third_quartile for b in boxes] == [90, 90.5, 86]
    assert [b.max for b in boxes] == [92, 95, 88]


def test_superchart(sandbox):
    chart = chart_of(sandbox, """
import numpy as np, matplotlib.pyplot as plt
fig, axs = plt.subplots(1, 2)
fig.suptitle('Several')
axs[0].plot(np.arange(10), np.arange(10)); axs[0].set_title('Line'); axs[0].grid(True)
axs[1].scatter([1, 2], [3, 4], label='pts'); axs[1].set_title('Scatter')
plt.show()
""")
    assert isinstance(chart, SuperChart)
    assert chart.type == ChartType.SUPERCHART
    assert chart.title == "Several"
    assert [type(c) for c in chart.elements] == [LineChart, ScatterChart]
    assert len(chart.elements[0].elements) == 1
    assert len(chart.elements[0].elements[0].points) == 10


def test_unknown_chart(sandbox):
    chart = chart_of(sandbox, """
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.add_artist(plt.Circle((0, 0), 1, fill=False))
plt.title('Circle')
plt.show()
""")
    assert chart.type == ChartType.UNKNOWN
    assert chart.title == "Circle"
    assert chart.elements == []
