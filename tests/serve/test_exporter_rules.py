"""The exporter's extras, in-process: the profile in force, the runs, the fans left
manual and the limits a killed program left are read beside each sample, and one
that cannot be read never hides the others; and ``--listen``'s words."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.parser import text_string_to_metric_families

from gpustation.control import journal, lease
from gpustation.errors import UsageError
from gpustation.runs.store import index as store_index
from gpustation.runs.store.index import RunStore
from gpustation.runs.summary import RunSummary
from gpustation.serve import exporter as exporter_module
from gpustation.serve.exporter import Exporter, is_loopback, parse_listen
from gpustation.serve.http import serve
from gpustation.telemetry.sampler import Sampler
from gpustation.telemetry.sim import SimBackend

Series = dict[tuple[tuple[str, str], ...], float]


def scrape(exporter: Exporter) -> dict[str, Series]:
    text = generate_latest(exporter.registry).decode()
    out: dict[str, Series] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def by_gpu(series: Series, *keys: str) -> dict[tuple[str, ...], float]:
    return {tuple(dict(labels)[k] for k in ("gpu", *keys)): v for labels, v in series.items()}


def gone_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def sim(gpustation_dirs: dict[str, Path]) -> SimBackend:
    return SimBackend(count=2, card="rtx4090", state_path=None)


def test_the_extras_are_read_beside_the_sample(sim: SimBackend) -> None:
    journal.record(
        gpu=0, uuid=None, what=journal.POWER_LIMIT, previous=450.0, new=315.0,
        command="gpustation profile apply quiet", simulated=True,
    )  # fmt: skip
    RunStore().upsert(RunSummary(id="r1", status="failed", started_at=1.0))
    sim.control.set_fan_speed(0, 1, 70)  # left manual, no controller drives it
    uuid1 = sim.read_gpus([1], slow=False)[0].uuid
    lease.take(
        lease.Lease(
            "sweep-x", "sweep x", [(1, uuid1)], True, "gpustation sweeps restore sweep-x",
            pid=gone_pid(), start="1",
        )
    )  # fmt: skip
    exporter = Exporter(Sampler(sim, with_host=False).sample)
    exporter.sample_once()
    exporter._refresh_extras()
    m = scrape(exporter)
    [(labels, value)] = m["gpustation_hardware_profile"].items()
    assert dict(labels)["profile"] == "quiet" and value == 1.0
    assert m["gpustation_runs"] == {(("status", "failed"),): 1.0}
    assert by_gpu(m["gpustation_fan_manual_unattended"], "fan") == {
        ("0", "0"): 0.0,
        ("0", "1"): 1.0,
        ("1", "0"): 0.0,
        ("1", "1"): 0.0,
    }
    assert by_gpu(m["gpustation_power_limit_left"], "note") == {
        ("1", "limit left by sweep x; `gpustation sweeps restore sweep-x`"): 1.0
    }


def test_an_extra_that_cannot_be_read_leaves_the_others(
    sim: SimBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    RunStore().upsert(RunSummary(id="r1", status="succeeded", started_at=1.0))
    sim.control.set_fan_speed(1, 0, 70)
    journal.record(
        gpu=0, uuid=None, what=journal.POWER_LIMIT, previous=450.0, new=315.0,
        command="gpustation profile apply quiet", simulated=True,
    )  # fmt: skip
    uuid0 = sim.read_gpus([0], slow=False)[0].uuid
    lease.take(lease.Lease("s", "sweep s", [(0, uuid0)], True, pid=gone_pid(), start="1"))

    def broken(*args: object) -> object:
        raise RuntimeError("unreadable")

    exporter = Exporter(Sampler(sim, with_host=False).sample)
    exporter.sample_once()
    with monkeypatch.context() as patch:
        patch.setattr(journal, "active_profile", broken)
        patch.setattr(lease, "left_notes", broken)
        exporter._refresh_extras()
    m = scrape(exporter)
    assert m["gpustation_up"] == {(): 1.0}
    assert "gpustation_hardware_profile" not in m and "gpustation_power_limit_left" not in m
    assert m["gpustation_runs"] == {(("status", "succeeded"),): 1.0}
    assert by_gpu(m["gpustation_fan_manual_unattended"], "fan")[("1", "0")] == 1.0
    with monkeypatch.context() as patch:
        patch.setattr(store_index, "runs_by_status", broken)
        patch.setattr(exporter_module, "unattended_manual_fans", broken)
        exporter._refresh_extras()
    m = scrape(exporter)
    assert "gpustation_runs" not in m and "gpustation_fan_manual_unattended" not in m
    assert m["gpustation_up"] == {(): 1.0}
    assert "gpustation_hardware_profile" in m and "gpustation_power_limit_left" in m


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            "[::1:9400",
            "--listen: put an IPv6 address in brackets, e.g. [::1]:9400, got '[::1:9400'",
        ),
        (
            "::1]:9400",
            "--listen: put an IPv6 address in brackets, e.g. [::1]:9400, got '::1]:9400'",
        ),
        ("[box]:9400", "--listen: 'box' is not an IPv6 address"),
        ("box:http", "--listen: port must be 1-65535, got 'http'"),
    ],
)
def test_a_listen_address_that_is_wrong_says_how(text: str, says: str) -> None:
    with pytest.raises(UsageError) as raised:
        parse_listen(text)
    assert str(raised.value) == says


def test_a_host_name_other_than_localhost_is_not_taken_for_loopback() -> None:
    assert not is_loopback("box.lan") and not is_loopback("")


def test_a_listen_host_that_does_not_resolve_is_named_with_why(sim: SimBackend) -> None:
    exporter = Exporter(Sampler(sim, with_host=False).sample, with_extras=False)
    for host, why in (
        ("no-such-host.invalid", None),
        ("a" * 64 + ".example", "not a valid host name"),
    ):
        with pytest.raises(UsageError) as raised:
            serve(exporter, host, 9400)
        said = str(raised.value)
        assert said.startswith(f"--listen: cannot resolve {host!r} (")
        assert said.endswith("); give an address such as 127.0.0.1:9400 or [::1]:9400")
        assert "None" not in said and (why is None or f"({why})" in said)


def test_the_extras_are_read_at_start_and_then_only_every_extras_interval(
    sim: SimBackend,
) -> None:
    def profile_seen(exporter: Exporter) -> bool:
        return "gpustation_hardware_profile" in scrape(exporter)

    def record_profile() -> None:
        journal.record(
            gpu=0, uuid=None, what=journal.POWER_LIMIT, previous=450.0, new=315.0,
            command="gpustation profile apply quiet", simulated=True,
        )  # fmt: skip

    slow = Exporter(Sampler(sim, with_host=False).sample, interval_s=0.01, extras_interval_s=3600)
    never = Exporter(Sampler(sim, with_host=False).sample, interval_s=0.01, with_extras=False)
    record_profile()
    for exporter in (slow, never):
        exporter.start()
    try:
        threads = [t for t in threading.enumerate() if t.name == "gpustation-exporter"]
        assert len(threads) == 2 and all(t.daemon for t in threads)
        assert profile_seen(slow) and not profile_seen(never)
        journal.record(
            gpu=0, uuid=None, what=journal.POWER_LIMIT, previous=315.0, new=300.0,
            command="gpustation power set 300", simulated=True,
        )  # fmt: skip
        taken = slow.samples_taken
        deadline = time.monotonic() + 30
        while slow.samples_taken < taken + 20:  # many samples, no extras read again
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert profile_seen(slow)  # still the profile read at start
    finally:
        for exporter in (slow, never):
            exporter.stop()
    assert not any(t.name == "gpustation-exporter" for t in threading.enumerate())


def test_each_format_gets_its_own_rendering_of_a_sample(sim: SimBackend) -> None:
    exporter = Exporter(Sampler(sim, with_host=False).sample, with_extras=False)
    exporter.sample_once()
    text = exporter.rendered(generate_latest)
    open_metrics = exporter.rendered(openmetrics.generate_latest)
    assert open_metrics != text and open_metrics.endswith(b"# EOF\n")
    assert exporter.rendered(generate_latest) is text  # rendered once for this sample
