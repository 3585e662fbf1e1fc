"""The shared text formats: a duration for a sentence."""

from __future__ import annotations

from gpustation.telemetry.format import NA, duration_words


def test_a_duration_reads_as_words() -> None:
    assert duration_words(None) == NA and duration_words(-1.0) == NA
    assert duration_words(0.4) == "0 s" and duration_words(44.6) == "45 s"
    assert duration_words(60.0) == "1 min" and duration_words(750.2) == "12 min 30 s"
    assert duration_words(3599.6) == "1 h 00 min"
    assert duration_words(2 * 3600 + 5 * 60 + 29) == "2 h 05 min"
