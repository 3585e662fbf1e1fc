"""An error about one input names its field; each caller words the field its own way."""

from __future__ import annotations

import pytest

from gpustation.errors import UsageError, flag
from gpustation.fleet.ssh import parse_host
from gpustation.runs.presets import RunPreset, apply_overrides
from gpustation.telemetry.backend import parse_gpu_list


def test_a_field_reads_as_its_flag_on_the_command_line_and_in_other_words_elsewhere() -> None:
    err = UsageError("between 100 and 700 W, got 50", field="power_limit")
    assert flag("power_limit") == "--power-limit"
    assert str(err) == "--power-limit: between 100 and 700 W, got 50"
    assert err.worded("Power limit") == "Power limit: between 100 and 700 W, got 50"
    part = UsageError("expected a number", field="set", subject="lr=fast")
    assert str(part) == "--set lr=fast: expected a number"
    assert part.worded("") == "lr=fast: expected a number"
    plain = UsageError("no such preset")
    assert plain.field is None and plain.worded("anything") == "no such preset"


def test_the_core_names_fields_not_flags() -> None:
    with pytest.raises(UsageError) as gpus:
        parse_gpu_list("0-x")
    assert gpus.value.field == "gpus" and str(gpus.value).startswith("--gpus: ")
    assert gpus.value.worded("GPUs").startswith("GPUs: '0-x'")
    with pytest.raises(UsageError) as host:
        parse_host("-oProxyCommand=x")
    assert host.value.field == "host" and host.value.worded("hosts").startswith("hosts: ")
    with pytest.raises(UsageError) as typed:
        apply_overrides(RunPreset(name="p", command=["x"], args={"lr": 0.1}), ["lr=fast"])
    assert (typed.value.field, typed.value.subject) == ("set", "lr=fast")
    assert str(typed.value).startswith("--set lr=fast: expected a finite number")
