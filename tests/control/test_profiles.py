"""Profile files: strict validation, power values, curves, the shipped set."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpustation.control.profiles import (
    FanCurve,
    PowerValue,
    list_profiles,
    load_profile,
    load_profile_file,
    parse_power_value,
)
from gpustation.errors import UsageError
from tests.control.conftest import cli


def write(tmp_path: Path, text: str, name: str = "p.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "kind", "amount"),
    [
        ("350", "watts", 350.0),
        ("350W", "watts", 350.0),
        ("350 w", "watts", 350.0),
        ("287.5 watts", "watts", 287.5),
        ("80%", "percent", 80.0),
        (" 78 % ", "percent", 78.0),
        ("default", "default", 0.0),
        (300, "watts", 300.0),
    ],
)
def test_power_values_parse(text: object, kind: str, amount: float) -> None:
    value = parse_power_value(text)
    assert (value.kind, value.amount) == (kind, amount)


@pytest.mark.parametrize("text", ["fast", "350 kW", "-5W", "0", "80%%", "%", "", True, [350]])
def test_bad_power_values_are_refused(text: object) -> None:
    with pytest.raises(ValueError, match="expected"):
        parse_power_value(text)


def test_percentages_scale_to_each_card() -> None:
    balanced = PowerValue("percent", 78)
    assert balanced.watts_for(450.0) == 351.0  # the seed's 350 W cap on an RTX 4090
    assert balanced.watts_for(700.0) == 546.0  # the same profile on an H200
    assert PowerValue("default").watts_for(450.0) == 450.0
    assert PowerValue("watts", 300).watts_for(None) == 300
    assert balanced.watts_for(None) is None


def test_every_problem_is_reported_with_file_and_key(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
colour = "red"
[power]
limit = "lots"
[fans]
mode = "curve"
points = [[50, 40], [45, 60], [80, 50], [90, 130]]
hysteresis = 3
min_pct = 70
max_pct = 60
""",
    )
    with pytest.raises(UsageError) as info:
        load_profile_file(path)
    message = str(info.value)
    lines = [line for line in message.splitlines() if line.startswith(f"  {path}: ")]
    problems = "\n".join(lines)
    assert "colour: unknown key" in problems
    assert "[power] limit: expected watts" in problems and "'lots'" in problems
    assert "[fans] points[1]: temperatures must strictly increase" in problems
    assert "[fans] points[2]: fan speeds must not decrease" in problems
    assert "[fans] points[3]: fan speed 130 % is outside 0-100 %" in problems
    assert "[fans] hysteresis: unknown key" in problems
    assert "[fans] min_pct: 70 is above max_pct 60" in problems
    assert len(lines) == 7
    assert "nothing was changed" in message


@pytest.mark.parametrize(
    ("fragment", "expected"),
    [
        (
            '[fans]\nmode = "auto"\npoints = [[50, 40]]',
            '[fans] points: only used with mode = "curve"',
        ),
        ('[fans]\nmode = "turbo"', '[fans] mode: expected "curve" or "auto"'),
        ('[fans]\nmode = "curve"', "[fans] points: missing"),
        (
            '[fans]\nmode = "curve"\npoints = [[50, "x"]]',
            "[fans] points[0]: expected [temperature C",
        ),
        (
            '[fans]\nmode = "curve"\npoints = [[50, 40]]\ninterpolate = "cubic"',
            "[fans] interpolate",
        ),
        (
            '[fans]\nmode = "curve"\npoints = [[50, 40]]\npoll_interval_s = 0',
            "[fans] poll_interval_s",
        ),
        (
            '[fans]\nmode = "curve"\npoints = [[50, 40]]\nmin_pct = true',
            "[fans] min_pct: expected a number",
        ),
        ("[power]\nlimit = 0", "[power] limit: expected watts between 1 and 5000"),
        ("[power]\ncap = 300", "[power] cap: unknown key"),
        ("[power]\n", "[power] limit: missing"),
        ('[power]\nlimit = "250%"', "[power] limit: expected a percentage"),
    ],
)
def test_single_problems(tmp_path: Path, fragment: str, expected: str) -> None:
    path = write(tmp_path, fragment)
    with pytest.raises(UsageError, match=re.escape(expected)):
        load_profile_file(path)


def test_broken_toml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[power\nlimit=")
    with pytest.raises(UsageError, match="not valid TOML") as info:
        load_profile_file(path)
    assert str(path) in str(info.value)


def test_step_and_linear_curves() -> None:
    points = ((40.0, 40.0), (60.0, 55.0), (70.0, 70.0), (80.0, 90.0), (85.0, 100.0))
    step = FanCurve(points=points, interpolate="step")
    assert [step.speed_at(t) for t in (20, 59.9, 60, 69, 70, 79.9, 80, 84, 85, 99)] == [
        40,
        40,
        55,
        55,
        70,
        70,
        90,
        90,
        100,
        100,
    ]
    linear = FanCurve(points=points, interpolate="linear")
    assert linear.speed_at(50) == pytest.approx(47.5)
    assert linear.speed_at(82.5) == pytest.approx(95.0)
    assert linear.speed_at(10) == 40 and linear.speed_at(95) == 100


def test_shipped_profiles_are_valid_and_complete() -> None:
    items = {i.name: i for i in list_profiles()}
    assert {"stock", "quiet", "balanced", "performance"} <= set(items)
    for item in items.values():
        assert item.error is None, item.error
        assert item.shipped
    stock = load_profile("stock")
    assert stock.power == PowerValue("default") and stock.fan_mode == "auto"
    balanced = load_profile("balanced")
    assert balanced.power == PowerValue("percent", 78)
    assert balanced.curve is not None and balanced.curve.interpolate == "step"
    # the seed's curve: <60 C 40 %, 60-70 C 55 %, 70-80 C 70 %, >80 C 90-100 %
    speeds = [balanced.curve.speed_at(t) for t in (50, 65, 75, 82, 90)]
    assert speeds == [40, 55, 70, 90, 100]


def test_user_profiles_override_shipped_ones(gpustation_dirs: dict[str, Path]) -> None:
    user = gpustation_dirs["config"] / "presets" / "profiles"
    user.mkdir(parents=True)
    (user / "balanced.toml").write_text('description = "mine"\n[power]\nlimit = "300W"\n')
    (user / "broken.toml").write_text("[power]\nlimit = 'x'\n")
    profile = load_profile("balanced")
    assert profile.description == "mine" and not profile.shipped
    items = {i.name: i for i in list_profiles()}
    assert items["balanced"].overrides_shipped
    assert items["broken"].error is not None and "[power] limit" in items["broken"].error


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(UsageError, match=r"no profile named 'turbo'.*balanced"):
        load_profile("turbo")


def test_profile_cli_list_and_show(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "profile", "list")
    assert code == 0
    assert {line.split()[0] for line in out.splitlines()} >= {"stock", "quiet", "balanced"}
    code, out, _ = cli(capsys, "profile", "show", "balanced")
    assert code == 0 and "78%" in out and "60 C 55 %" in out


def test_invalid_profile_exits_2_before_reading_any_gpu(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, gpustation_dirs: dict[str, Path]
) -> None:
    path = write(tmp_path, '[power]\nlimit = "fast"\n', "bad.toml")
    # No --simulate and no driver: had it opened a backend, it would exit 3.
    code, _, err = cli(capsys, "profile", "apply", str(path))
    assert code == 2
    assert f"{path}: [power] limit" in err
    assert not (gpustation_dirs["state"] / "control-journal.jsonl").exists()
