"""A sweep's report stated exactly: each point's figures from its run directory,
the recommendation's words, the SVG and terminal plots, and the points table."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from gpustation.runs import rundir
from gpustation.runs.rundir import RunState
from gpustation.runs.sweep import report as sweep_report
from gpustation.runs.sweep.model import Point, Sweep

SVG = "{http://www.w3.org/2000/svg}"


def _write(
    directory: Path, metrics: list[dict[str, Any]], telemetry: list[dict[str, Any]], **state: Any
) -> Path:
    directory.mkdir(parents=True)
    if state:
        rundir.write_state(directory, RunState(id=directory.name, **state))
    (directory / rundir.METRICS_FILE).write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (directory / rundir.TELEMETRY_FILE).write_text("".join(json.dumps(t) + "\n" for t in telemetry))
    return directory


def _sample(time: float, *gpus: dict[str, Any]) -> dict[str, Any]:
    return {"t": time - 100.0, "time": time, "gpus": list(gpus)}


def test_work_units_from_throughput_units() -> None:
    assert sweep_report.work_unit("img/s") == "img"
    assert sweep_report.work_unit("tokens/s") == "token"
    assert sweep_report.work_unit(" its /s") == "its"  # three letters: not a plural
    assert sweep_report.work_unit("samples / s") == "sample"
    assert sweep_report.work_unit("steps") is None
    assert sweep_report.work_unit(None) is None and sweep_report.work_unit("") is None


def test_the_warmup_is_left_out_from_the_run_s_start(tmp_path: Path) -> None:
    d = _write(
        tmp_path / "p",
        [
            {"time": 100.0 + t, "throughput": tp, "unit": u}
            for t, tp, u in ((1, 10.0, None), (2, 50.0, None), (3, 30.0, "img/s"), (4, 40.0, "x/s"))
        ],
        [
            _sample(100.0 + t, {"index": 0, "power_w": w})
            for t, w in ((0, 900.0), (2, 100.0), (3, 300.0), (4, 300.0), (6, 900.0))
        ],
        status="succeeded",
        started_at=100.0,
        ended_at=104.0,
    )
    f = sweep_report.point_figures(d, warmup_s=2.0)
    assert f["throughput"] == pytest.approx(40.0)  # the reports at 2, 3 and 4 s
    assert (f["unit"], f["work_unit"]) == ("img/s", "img")  # the first one named
    # No counters: power integrated over 2..5 s (the sample at 6 s is past the end + 1 s).
    assert f["window_s"] == 2.0 and f["energy_j"] == pytest.approx(200.0 + 300.0)
    assert f["avg_power_w"] == pytest.approx(250.0)
    assert f["energy_per_unit_j"] == pytest.approx(250.0 / 40.0)
    assert f["peak_power_w"] == 900.0  # the peaks are the whole run's
    without = sweep_report.point_figures(d)
    assert without["throughput"] == pytest.approx(32.5)  # from the first report on


def test_a_point_without_reports_or_samples_has_no_figures(tmp_path: Path) -> None:
    d = _write(tmp_path / "p", [{"time": 1.0, "loss": 2.0}], [])
    assert sweep_report.point_figures(d) == {}
    one = _write(tmp_path / "q", [], [_sample(1.0, {"index": 0, "power_w": 50.0})])
    assert sweep_report.point_figures(one) == {"peak_power_w": 50.0, "throttled_s": 0.0}


def test_energy_from_counters_of_every_gpu_or_else_from_power(tmp_path: Path) -> None:
    both = [
        _sample(
            100.0,
            {"index": 0, "power_w": 100.0, "energy_j": 0.0},
            {"index": 1, "power_w": 100.0, "energy_j": 50.0},
        ),
        _sample(
            110.0,
            {"index": 0, "power_w": 100.0, "energy_j": 3000.0},
            {"index": 1, "power_w": 100.0, "energy_j": 1050.0},
        ),
    ]
    assert sweep_report._power_figures(both) == {
        "window_s": 10.0,
        "energy_j": 4000.0,
        "avg_power_w": 400.0,
    }
    half = [
        _sample(
            100.0, {"index": 0, "power_w": 100.0, "energy_j": 0.0}, {"index": 1, "power_w": 50.0}
        ),
        _sample(
            110.0, {"index": 0, "power_w": 300.0, "energy_j": 9e9}, {"index": 1, "power_w": 50.0}
        ),
    ]
    assert sweep_report._power_figures(half)["energy_j"] == pytest.approx(10 * (150 + 350) / 2)
    backwards = [
        _sample(100.0, {"index": 0, "power_w": 10.0, "energy_j": 500.0}),
        _sample(102.0, {"index": 0, "power_w": 30.0, "energy_j": 100.0}),
    ]
    assert sweep_report._power_figures(backwards)["energy_j"] == pytest.approx(40.0)
    assert sweep_report._power_figures([both[0], both[0]]) == {}


def test_the_peak_power_counts_the_counter_between_readings(tmp_path: Path) -> None:
    samples = [
        _sample(
            100.0,
            {
                "index": 0,
                "power_w": 100.0,
                "energy_j": 0.0,
                "temperature_c": 60,
                "memory_used_mib": 10,
            },
        ),
        _sample(
            101.0,
            {
                "index": 0,
                "power_w": 100.0,
                "energy_j": 700.0,
                "temperature_c": 50,
                "memory_used_mib": 30,
                "throttle": ["hw_slowdown"],
            },
        ),
        _sample(103.0, {"index": 0, "power_w": 200.0, "energy_j": 900.0, "throttle": ["x"]}),
        _sample(104.0, {"index": 0, "power_w": 200.0, "energy_j": 100.0}),
    ]
    assert sweep_report._peaks(samples) == {
        "peak_power_w": 700.0,
        "peak_temp_c": 60,
        "peak_vram_mib": 30,
        "throttled_s": 3.0,
    }
    assert sweep_report._counter_power(samples[0], samples[0]) is None  # no time between
    assert sweep_report._counter_power(samples[2], samples[3]) is None  # counter went back
    other = _sample(105.0, {"index": 1, "energy_j": 5.0})
    assert sweep_report._counter_power(samples[3], other) is None  # other cards
    blank = _sample(106.0, {"index": 0, "energy_j": None})
    assert sweep_report._counter_power(samples[3], blank) is None
    assert sweep_report._peaks([]) == {}


def _p(index: int, tp: float, jpu: float, **figures: Any) -> Point:
    return Point(
        index,
        {"bs": str(2**index)},
        status="succeeded",
        figures={"throughput": tp, "energy_per_unit_j": jpu, **figures},
    )


def _sweep(*points: Point, within: float = 5.0, simulated: bool = False) -> Sweep:
    return Sweep(
        id="s<1>",
        preset="p",
        axes={},
        power_limits=[],
        gpus=[0],
        within_pct=within,
        points=list(points),
        simulated=simulated,
    )


def test_the_recommendation_in_words() -> None:
    unit = {"unit": "img/s", "work_unit": "img"}
    two = _sweep(_p(0, 1000.0, 2.0, **unit), _p(1, 960.0, 1.5, **unit))
    assert sweep_report.recommendation_text(two) == (
        "Fastest: bs=1, 1,000.0 img/s at 2 J/img. Least energy within 5 % of that: bs=2, "
        "960.0 img/s (-4.0 %) at 1.5 J/img (-25.0 %)."
    )
    one = _sweep(_p(0, 10.0, 2.0))
    assert sweep_report.recommendation_text(one) == (
        "Fastest: bs=1, 10.0 /s at 2 J/unit. It also uses the least energy per unit within "
        "5 % of it."
    )
    none = _sweep(Point(0, {}, status="failed"))
    assert sweep_report.recommendation_text(none) == (
        "No point finished with both a throughput and an energy figure."
    )
    assert sweep_report.measured(_sweep(_p(0, 10, 2.0))) == []  # whole numbers: not figures


def _at(element: ET.Element, name: str) -> float:
    """An SVG element's numeric attribute; a missing one fails the test."""
    value = element.get(name)
    assert value is not None, f"<{element.tag}> has no {name}"
    return float(value)


def _svg(s: Sweep) -> ET.Element:
    return ET.fromstring(sweep_report.svg_plot(s))


def test_the_svg_plot_places_each_point_and_marks_the_front() -> None:
    s = _sweep(_p(0, 100.0, 2.0), _p(1, 200.0, 1.0), _p(2, 150.0, 3.0), within=60.0)
    root = _svg(s)
    assert (root.get("width"), root.get("height"), root.get("viewBox")) == (
        "720",
        "480",
        "0 0 720 480",
    )
    circles = root.findall(f"{SVG}circle")
    # x: 100..200 with an 8 % margin over 80..690; y: 1..3 J the same over 420..40 (up).
    got: dict[str | None, tuple[object, object, str | None]] = {
        c.findtext(f"{SVG}title"): (_at(c, "cx"), _at(c, "cy"), c.get("fill")) for c in circles
    }
    assert got == {
        "bs=1": (pytest.approx(122.1, abs=0.06), pytest.approx(230.0, abs=0.06), "#1f77b4"),
        "bs=2": (pytest.approx(647.9, abs=0.06), pytest.approx(393.8, abs=0.06), "#d62728"),
        "bs=4": (pytest.approx(385.0, abs=0.06), pytest.approx(66.2, abs=0.06), "#1f77b4"),
    }
    assert all(c.get("r") == "5" for c in circles)
    line = root.find(f"{SVG}polyline")
    assert line is not None and line.get("points") == "647.9,393.8"
    assert (line.get("fill"), line.get("stroke")) == ("none", "#d62728")
    texts = [t.text for t in root.findall(f"{SVG}text")]
    assert texts[0] == "sweep s<1>: throughput against energy per unit"
    assert "bs=2 (fastest) (recommended)" in texts and "bs=1" in texts
    assert "throughput (/s)" in texts and "energy (J/unit)" in texts and "Pareto front" in texts
    ticks_x = [t.text for t in root.findall(f"{SVG}text") if t.get("y") == "436"]
    assert ticks_x == ["92", "121", "150", "179", "208"]
    ticks_y = [t.text for t in root.findall(f"{SVG}text") if t.get("text-anchor") == "end"][:5]
    assert ticks_y == ["0.84", "1.42", "2", "2.58", "3.16"]
    label = next(t for t in root.findall(f"{SVG}text") if t.text == "bs=1")
    at: tuple[object, object] = (_at(label, "x"), _at(label, "y"))
    assert at == (
        pytest.approx(130.1, abs=0.06),
        pytest.approx(224.0, abs=0.06),
    )


def test_the_svg_plot_of_one_point_or_none() -> None:
    root = _svg(_sweep(_p(0, 100.0, 2.0, unit="img/s", work_unit="img")))
    (circle,) = root.findall(f"{SVG}circle")
    assert (_at(circle, "cx"), _at(circle, "cy")) == (385.0, 230.0)  # the middle
    texts = [t.text for t in root.findall(f"{SVG}text")]
    assert "throughput (img/s)" in texts and "energy (J/img)" in texts
    empty = _svg(_sweep(Point(0, {}, status="failed")))
    assert [t.text for t in empty.findall(f"{SVG}text")][-1] == "no measured point"
    assert empty.findall(f"{SVG}circle") == []
    assert sweep_report._span([1.0, 1.0]) == pytest.approx((0.884, 1.116))


def _visible(text: str) -> list[str]:
    return [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in text.splitlines()]


def test_the_terminal_plot_marks_the_fastest_and_the_recommended() -> None:
    s = _sweep(
        _p(0, 100.0, 2.0, unit="img/s", work_unit="img"),
        _p(1, 200.0, 1.5),
        _p(2, 195.0, 1.0),
        _p(3, 50.0, 3.0),
    )
    text = sweep_report.terminal_plot(s, width=100, height=24)
    red = "\x1b[38;5;1m"
    assert f"{red}#2 fastest\x1b[0m" in text and f"{red}#3 recommended\x1b[0m" in text
    assert set(re.findall(r"\x1b\[[0-9;]*m", text)) == {"\x1b[0m", red}  # the terminal's colours
    lines = _visible(text)
    assert len(lines) == 24 and {len(line.rstrip()) <= 100 for line in lines} == {True}
    assert max(len(line) for line in lines) == 100  # the size asked for
    assert "▞▞ points" in lines[1] and "•• Pareto front" in lines[2]
    assert re.search(r"\bJ/img\b", lines[-1]) and "throughput (img/s)" in lines[-1]
    plain = _visible(sweep_report.terminal_plot(_sweep(_p(0, 100.0, 2.0)), width=60, height=12))
    assert "#1 fastest, recommended" in "\n".join(plain)
    assert "points" not in "\n".join(plain) and "•• Pareto front" in plain[1]
    assert re.search(r"^J/unit\s+throughput \(/s\)", plain[-1])
    assert sweep_report.terminal_plot(_sweep()) == ""


def test_the_points_table() -> None:
    s = _sweep(
        _p(
            0,
            1234.56,
            0.123456,
            unit="tok/s",
            work_unit="tok",
            avg_power_w=299.6,
            peak_power_w=350.4,
            peak_temp_c=71.2,
            throttled_s=3.0,
            peak_vram_mib=12345.0,
        ),
        Point(1, {}, power="70%", status="failed", run_id="r2"),
        simulated=True,
    )
    assert sweep_report.point_columns(s) == [
        "#",
        "point",
        "status",
        "throughput (tok/s)",
        "J/tok",
        "avg W",
        "peak W",
        "peak °C",
        "throttled s",
        "peak VRAM MiB",
        "run",
    ]
    assert sweep_report.point_rows(s) == [
        [
            "1",
            "bs=1",
            "succeeded [SIMULATED]",
            "1,234.6",
            "0.1235",
            "300",
            "350",
            "71",
            "3",
            "12,345",
            "n/a",
        ],
        [
            "2",
            "power=70%",
            "failed [SIMULATED]",
            "n/a",
            "n/a",
            "n/a",
            "n/a",
            "n/a",
            "n/a",
            "n/a",
            "r2",
        ],
    ]
    plain = _sweep(Point(0, {}))
    assert sweep_report.point_columns(plain)[3:5] == ["throughput (/s)", "J/unit"]
    assert sweep_report.point_rows(plain)[0][2] == "pending"


def test_the_svg_plot_s_frame_fits_the_canvas() -> None:
    s = _sweep(_p(0, 100.0, 2.0), _p(1, 200.0, 1.0), _p(2, 300.0, 1.5), within=60.0)
    svg = sweep_report.svg_plot(s, width=600, height=400)
    lines = svg.splitlines()
    assert lines[0].startswith("<svg ") and lines[-1] == "</svg>"
    assert all(line.startswith("<") and line.endswith(">") for line in lines)
    root = ET.fromstring(svg)
    (rect,) = root.findall(f"{SVG}rect")
    assert rect.attrib == {"width": "100%", "height": "100%", "fill": "white"}
    x_axis, y_axis = root.findall(f"{SVG}line")
    assert [x_axis.get(k) for k in ("x1", "y1", "x2", "y2")] == ["80", "340", "570", "340"]
    assert [y_axis.get(k) for k in ("x1", "y1", "x2", "y2")] == ["80", "40", "80", "340"]
    texts = root.findall(f"{SVG}text")
    title = texts[0]
    assert (title.get("x"), title.get("y")) == ("300.0", "22")  # centred on the canvas
    x_label = next(t for t in texts if (t.text or "").startswith("throughput ("))
    assert (x_label.get("x"), x_label.get("y")) == ("340.0", "385")
    y_label = next(t for t in texts if (t.text or "").startswith("energy ("))
    assert (y_label.get("y"), y_label.get("transform")) == ("190.0", "rotate(-90 18 190.0)")
    legend = next(t for t in texts if t.text == "Pareto front")
    assert (legend.get("x"), legend.get("y")) == ("570", "40")
    y_ticks = [t for t in texts if t.get("text-anchor") == "end" and t is not legend]
    assert {t.get("x") for t in y_ticks} == {"74"}
    # the lowest tick sits on the x axis, its text's baseline 4 px below it
    assert _at(y_ticks[0], "y") == pytest.approx(344.0)
    line = root.find(f"{SVG}polyline")
    assert line is not None and len(line.get("points", "").split(" ")) == 2
    assert (line.get("stroke-width"), line.get("fill")) == ("2", "none")
    for element in root.iter():
        for key in ("x", "cx", "x1", "x2"):
            if key in element.attrib:
                assert 0 <= float(element.attrib[key]) <= 600, (element.tag, element.attrib)
        for key in ("y", "cy", "y1", "y2"):
            if key in element.attrib:
                assert 0 <= float(element.attrib[key]) <= 400, (element.tag, element.attrib)
    empty = ET.fromstring(sweep_report.svg_plot(_sweep(), width=600, height=400))
    none_text = empty.findall(f"{SVG}text")[-1]
    assert (none_text.get("x"), none_text.get("y")) == ("300.0", "200.0")


def test_a_span_of_one_value_is_widened_around_it() -> None:
    assert sweep_report._span([1.0, 1.5]) == pytest.approx((0.96, 1.54))
    lo, hi = sweep_report._span([0.0, 0.0])
    assert lo == pytest.approx(-1.16e-9, abs=1e-13) and hi == pytest.approx(1.16e-9, abs=1e-13)


def test_the_recommendation_s_percentages() -> None:
    s = _sweep(_p(0, 1000.0, 2.0), _p(1, 500.0, 1.0), within=60.0)
    assert sweep_report.recommendation_text(s).endswith(
        "Least energy within 60 % of that: bs=2, 500.0 /s (-50.0 %) at 1 J/unit (-50.0 %)."
    )


def _grid(axes: dict[str, list[str]], powers: list[str]) -> Sweep:
    sweep = Sweep(id="s", preset="p", axes=axes, power_limits=powers, gpus=[0])
    sweep.points = [
        Point(
            index=0, overrides={k: v[0] for k, v in axes.items()}, power=next(iter(powers), None)
        ),
    ]
    return sweep


def test_a_point_is_labelled_by_what_sets_it_apart_and_the_rest_is_said_once() -> None:
    sweep = _grid({"batch": ["16", "32"], "lr": ["0.1"]}, ["70%", "80%"])
    point = Point(index=1, overrides={"batch": "32", "lr": "0.1"}, power="80%")
    assert sweep_report.constants(sweep) == ["lr=0.1"]
    assert sweep_report.point_label(sweep, point) == "batch=32 power=80%"
    one_power = _grid({"batch": ["16", "32"]}, ["70%"])
    assert sweep_report.constants(one_power) == ["power=70%"]
    assert sweep_report.point_label(one_power, Point(1, {"batch": "32"}, "70%")) == "batch=32"
    shared = _grid({"lr": ["0.1"]}, ["70%"])
    assert sweep_report.constants(shared) == ["lr=0.1", "power=70%"]
    assert sweep_report.point_label(shared, shared.points[0]) == "(as above)"
    bare = _grid({}, [])
    assert sweep_report.constants(bare) == []
    assert sweep_report.point_label(bare, Point(0, {})) == "(defaults)"
    assert sweep_report.point_label(bare, Point(0, {}, power="300W")) == "power=300W"


def test_the_points_table_leaves_the_constants_out_only_when_asked() -> None:
    sweep = _grid({"batch": ["16", "32"], "lr": ["0.1"]}, [])
    assert sweep_report.point_rows(sweep)[0][1] == "batch=16 lr=0.1"
    assert sweep_report.point_rows(sweep, constants_apart=True)[0][1] == "batch=16"
