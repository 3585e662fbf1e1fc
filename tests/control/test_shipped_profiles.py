"""What a shipped profile's description says it sets is what it sets."""

from __future__ import annotations

import re

import pytest

from gpustation.control.profiles import list_profiles, load_profile
from tests.control.conftest import RecordingSim, cli

_NAMED_WATTS = re.compile(r"(\d+) W on an? RTX 4090")


def test_a_description_that_names_watts_names_what_the_profile_sets(
    sim: RecordingSim, capsys: pytest.CaptureFixture[str]
) -> None:
    named = {
        listing.name: int(m.group(1))
        for listing in list_profiles()
        if (m := _NAMED_WATTS.search(load_profile(listing.name).description))
    }
    assert "balanced" in named  # the test reads the descriptions it means to
    for name, watts in named.items():
        code, out, err = cli(capsys, "profile", "apply", name, "--power-only", "--dry-run")
        assert code == 0, err
        assert f"450 W -> {watts} W" in out, (name, out)
