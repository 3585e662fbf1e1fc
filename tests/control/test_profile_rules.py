"""Profiles, in-process: the edges of every range a profile may hold, the wording of
each problem, what a profile without a part holds, and how a name or a path finds
its file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpustation.control.profiles import (
    FanCurve,
    PowerValue,
    list_profiles,
    load_profile,
    load_profile_file,
    parse_power_value,
    parse_profile,
)
from gpustation.errors import UsageError
from gpustation.paths import user_profiles_dir

SHIPPED = ["balanced", "performance", "quiet", "stock"]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        (1, PowerValue("watts", 1.0)),
        (5000, PowerValue("watts", 5000.0)),
        ("1W", PowerValue("watts", 1.0)),
        ("5000 W", PowerValue("watts", 5000.0)),
        ("1%", PowerValue("percent", 1.0)),
        ("1.5%", PowerValue("percent", 1.5)),
        ("200%", PowerValue("percent", 200.0)),
    ],
)
def test_the_ends_of_each_power_range_are_accepted(text: object, value: PowerValue) -> None:
    assert parse_power_value(text) == value


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (5000.5, "expected watts between 1 and 5000, got 5000.5"),
        ("5000.5W", "expected watts between 1 and 5000, got '5000.5W'"),
        ("0.5%", "expected a percentage of the default limit from 1 to 200, got '0.5%'"),
        ("200.5%", "expected a percentage of the default limit from 1 to 200, got '200.5%'"),
        (
            "lots",
            "expected watts (350, 350W) or a percentage of the default limit (78%) or "
            "default, got 'lots'",
        ),
    ],
)
def test_past_each_end_is_refused_in_words(text: object, says: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_power_value(text)
    assert str(raised.value) == says


def curve(**fans: object) -> FanCurve | None:
    profile = parse_profile({"fans": {"mode": "curve", **fans}}, "p", Path("p.toml"))
    return profile.curve


def problems(data: dict[str, object]) -> list[str]:
    with pytest.raises(UsageError) as raised:
        parse_profile(data, "p", Path("p.toml"))
    first, *rest = str(raised.value).splitlines()
    assert first == "profile 'p' (p.toml) is not valid; nothing was changed:"
    return [line.removeprefix("  p.toml: ") for line in rest]


def test_a_curve_may_span_0_to_120_c_and_0_to_100_percent_and_stay_flat() -> None:
    got = curve(points=[[0, 0], [60, 40], [80, 40], [120, 100]], hysteresis_c=0, min_pct=50,
                max_pct=50, spin_down_delay_s=3600, emergency_margin_c=30)  # fmt: skip
    assert got is not None
    assert got.points == ((0.0, 0.0), (60.0, 40.0), (80.0, 40.0), (120.0, 100.0))
    assert (got.hysteresis_c, got.min_pct, got.max_pct) == (0.0, 50.0, 50.0)
    assert (got.spin_down_delay_s, got.emergency_margin_c) == (3600.0, 30.0)
    assert curve(points=[[40, 30]], hysteresis_c=7, poll_interval_s=0.5) == FanCurve(
        points=((40.0, 30.0),), hysteresis_c=7.0, poll_interval_s=0.5
    )


def test_each_point_out_of_range_or_out_of_order_is_named() -> None:
    fans = {
        "mode": "curve",
        "points": [[-1, 30], [120.5, 100.5], [50, 40], [50, 30], [60, 20, 10], "x", [70, 50]],
    }
    assert problems({"fans": fans}) == [
        "[fans] points[0]: temperature -1 C is outside 0-120 C",
        "[fans] points[1]: temperature 120.5 C is outside 0-120 C",
        "[fans] points[1]: fan speed 100.5 % is outside 0-100 %",
        "[fans] points[2]: temperatures must strictly increase, got 50 C after 120.5 C",
        "[fans] points[2]: fan speeds must not decrease as temperature rises, "
        "got 40 % after 100.5 %",
        "[fans] points[3]: temperatures must strictly increase, got 50 C after 50 C",
        "[fans] points[3]: fan speeds must not decrease as temperature rises, got 30 % after 40 %",
        "[fans] points[4]: expected [temperature C, fan %] as two numbers, got [60, 20, 10]",
        "[fans] points[5]: expected [temperature C, fan %] as two numbers, got 'x'",
    ]


@pytest.mark.parametrize(
    ("fans", "says"),
    [
        ({}, "[fans] points: missing; expected a list of [temperature C, fan %] pairs"),
        (
            {"points": "hot"},
            "[fans] points: expected a non-empty list of [temperature C, fan %] pairs, got 'hot'",
        ),
        (
            {"points": []},
            "[fans] points: expected a non-empty list of [temperature C, fan %] pairs, got []",
        ),
        (
            {"points": [[40, 30]], "hysteresis_c": -0.5},
            "[fans] hysteresis_c: expected a number from 0 to 30, got -0.5",
        ),
        (
            {"points": [[40, 30]], "min_pct": 60, "max_pct": 50},
            "[fans] min_pct: 60 is above max_pct 50; expected min_pct <= max_pct",
        ),
    ],
)
def test_a_curve_problem_reads_as_it_should(fans: dict[str, object], says: str) -> None:
    assert problems({"fans": {"mode": "curve", **fans}}) == [says]


def test_a_linear_curve_follows_its_line_up_to_its_last_point() -> None:
    # The last point's speed (60 %) is below temperatures the line still covers.
    line = FanCurve(points=((30.0, 40.0), (90.0, 60.0)))
    assert line.speed_at(70.0) == pytest.approx(40.0 + 20.0 * 40.0 / 60.0)
    assert line.speed_at(90.0) == 60.0 and line.speed_at(30.0) == 40.0


def test_a_profile_without_a_part_leaves_that_part_alone() -> None:
    bare = parse_profile({}, "bare", Path("/p/bare.toml"))
    assert (bare.name, bare.path, bare.description) == ("bare", Path("/p/bare.toml"), "")
    assert bare.power is None and bare.fan_mode is None and bare.curve is None
    assert bare.shipped is False
    assert parse_profile({}, "s", Path("s.toml"), shipped=True).shipped is True


def test_each_part_of_the_wrong_kind_is_named() -> None:
    assert problems({"description": 5, "power": "300W", "fans": "auto"}) == [
        "description: expected a string, got 5",
        "power: expected a [power] table, got '300W'",
        "fans: expected a [fans] table, got 'auto'",
    ]
    assert problems({"power": {}}) == [
        '[power] limit: missing; expected watts ("350W"), a percentage of the default ("78%") '
        'or "default"'
    ]
    assert problems({"fans": {"mode": "auto", "speed": 3}}) == [
        "[fans] speed: unknown key; expected one of emergency_margin_c, hysteresis_c, "
        "interpolate, max_pct, min_pct, mode, points, poll_interval_s, spin_down_delay_s"
    ]


def test_a_file_is_named_by_its_stem_and_is_the_user_s(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('description = "m"\n[power]\nlimit = "300W"\n')
    profile = load_profile_file(path)
    assert (profile.name, profile.path, profile.shipped) == ("mine", path, False)


def test_a_profile_that_is_not_a_file_is_named_as_a_profile(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as raised:
        load_profile_file(tmp_path / "absent.toml")
    assert str(raised.value).startswith(f"cannot read profile {tmp_path / 'absent.toml'}: ")


def test_a_toml_file_or_a_path_is_read_as_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "here.toml").write_text('[power]\nlimit = "300W"\n')
    (tmp_path / "plain").write_text('[power]\nlimit = "250W"\n')
    monkeypatch.chdir(tmp_path)
    assert load_profile("here.toml").power == PowerValue("watts", 300.0)
    assert load_profile(f"{tmp_path}/plain").power == PowerValue("watts", 250.0)
    with pytest.raises(UsageError) as raised:
        load_profile("turbo")
    assert str(raised.value) == (
        f"no profile named 'turbo' (profiles: {', '.join(SHIPPED)}; "
        f"add your own in {user_profiles_dir()})"
    )


def test_shipped_profiles_say_so_by_name_and_in_the_listing() -> None:
    assert load_profile("quiet").shipped is True
    listing = {item.name: item for item in list_profiles()}
    assert sorted(listing) == SHIPPED
    quiet = listing["quiet"]
    assert quiet.path.name == "quiet.toml" and quiet.path.is_file()
    assert quiet.profile is not None and quiet.profile.shipped is True
