"""The one grammar for spans and times a user types."""

from __future__ import annotations

from datetime import datetime

import pytest

from gpustation.errors import UsageError
from gpustation.timespec import parse_since, parse_span, parse_time

NOW = datetime(2026, 12, 1, 20, 30, 0).timestamp()


def test_spans_in_every_unit() -> None:
    assert parse_span("90s") == 90
    assert parse_span("5m") == 300
    assert parse_span("1.5h") == 5400
    assert parse_span("3d") == 3 * 86400
    assert parse_span("1w") == 7 * 86400
    for bad in ("", "5", "5y", "-5m", "m"):
        with pytest.raises(UsageError, match=r"--older-than: a span \(90s, 5m, 2h, 3d, 1w\)"):
            parse_span(bad, "--older-than")


def test_a_span_may_have_spaces_around_and_before_its_unit_but_only_one_unit() -> None:
    assert parse_span(" 1.5d ") == 1.5 * 86400
    assert parse_span("2 w") == 2 * 7 * 86400
    with pytest.raises(UsageError) as err:
        parse_span("soon")
    assert str(err.value) == "the span: a span (90s, 5m, 2h, 3d, 1w), got 'soon'"
    for bad in ("3", "d", "-1d", "1d2h"):
        with pytest.raises(UsageError) as err:
            parse_span(bad, "--older-than")
        assert str(err.value) == f"--older-than: a span (90s, 5m, 2h, 3d, 1w), got {bad!r}"


def test_clock_times_dates_relative_times_and_unix_seconds() -> None:
    assert parse_time("20:02", reference=NOW) == datetime(2026, 12, 1, 20, 2).timestamp()
    assert parse_time("20:02:46", reference=NOW) == datetime(2026, 12, 1, 20, 2, 46).timestamp()
    assert parse_time("2026-12-01", reference=NOW) == datetime(2026, 12, 1).timestamp()
    assert parse_time("2026-12-01T20:02") == datetime(2026, 12, 1, 20, 2).timestamp()
    assert parse_time("1970-01-12T13:46:40Z") == 1_000_000.0
    assert parse_time("1970-01-12T15:46:40+02:00") == 1_000_000.0
    assert parse_time("1000000.5") == 1000000.5
    assert parse_time("-3s", reference=NOW) == NOW - 3
    assert parse_time("-5m", reference=NOW) == NOW - 300
    assert parse_time("+30s", reference=NOW) == NOW + 30


def test_within_bounds_a_span_counts_from_the_start_and_a_clock_time_finds_its_day() -> None:
    start = datetime(2026, 12, 1, 23, 50).timestamp()
    end = datetime(2026, 12, 2, 0, 10).timestamp()
    assert parse_time("90s", reference=end, within=(start, end)) == start + 90
    # 23:55 is on the day before the end's
    assert parse_time("23:55", reference=end, within=(start, end)) == start + 300


def test_since_is_a_span_back_from_now_or_a_time() -> None:
    assert parse_since("7d", now=NOW) == NOW - 7 * 86400
    assert parse_since("-5m", now=NOW) == NOW - 300
    assert parse_since("2026-12-01", now=NOW) == datetime(2026, 12, 1).timestamp()


def test_a_bad_time_names_the_option_and_the_forms() -> None:
    for bad in ("yesterday", "nan", "inf", "2026-13-01", "25:00", "20:61"):
        with pytest.raises(UsageError) as err:
            parse_time(bad, "--at", reference=NOW)
        text = str(err.value)
        assert text.startswith("--at: ") and "20:02:46" in text and "-3s" in text
        assert "2026-12-01T20:02" in text and repr(bad) in text
    with pytest.raises(UsageError, match="--since: a span"):
        parse_since("soon", "--since", now=NOW)
