"""The time formats gpustation writes: one module, one format per purpose."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpustation import timefmt

PACKAGE = Path(timefmt.__file__).resolve().parent


@pytest.fixture
def tokyo_time(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_people_read_local_time_and_names_carry_utc(tokyo_time: None) -> None:
    t = 1e9 + 0.5  # 2001-09-09 01:46:40 UTC, 10:46:40 in Tokyo
    assert timefmt.clock(t) == "10:46:40"
    assert timefmt.stamp(t) == "2001-09-09 10:46"
    assert timefmt.full(t) == "2001-09-09 10:46:40"
    assert timefmt.full(t, zone=True) == "2001-09-09 10:46:40 +0900"
    assert timefmt.compact(t) == "09-09 10:46"
    assert timefmt.compact(t, seconds=True) == "09-09 10:46:40"
    assert timefmt.day(t) == "2001-09-09"
    assert timefmt.file_stamp(t) == "20010909-014640"
    assert timefmt.recent(t, now=t + 60) == "10:46:40"
    assert timefmt.recent(t, now=t + 2 * 86400) == "2001-09-09 10:46:40"


def test_every_time_gpustation_writes_goes_through_timefmt() -> None:
    found = [
        f"{path.relative_to(PACKAGE)}:{n}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "timefmt.py"
        # the dashboard's views outside the replay come through it in a later change
        and ("tui" not in path.relative_to(PACKAGE).parts or path.name == "replay.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bstrftime\(", line)
    ]
    assert found == []
