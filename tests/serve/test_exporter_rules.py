"""The exporter's extras, in-process: the profile in force, the runs, the fans left
manual and the limits a killed program left are read beside each sample, and one
that cannot be read never hides the others; and ``--listen``'s words."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

from gpustation.control import journal, lease
from gpustation.errors import UsageError
from gpustation.runs.store import index as store_index
from gpustation.runs.store.index import RunStore
from gpustation.runs.summary import RunSummary
from gpustation.serve import exporter as exporter_module
from gpustation.serve.exporter import Exporter, is_loopback, parse_listen, snapshot_metrics
from gpustation.serve.http import serve
from gpustation.telemetry.alerts import Alert
from gpustation.telemetry.model import GpuSample, ProcessInfo, Snapshot
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


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def exposition(families: list[Metric]) -> list[str]:
    """The text format's lines, as a scraper reads them."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry).decode().splitlines()


def family(name: str, help: str, *rows: str) -> list[str]:
    return [f"# HELP {name} {help}", f"# TYPE {name} gauge", *(name + row for row in rows)]


#: GPU 0's labels: a card that reports no UUID, name or bus id gets empty labels
G0 = 'UUID="",gpu="0",hostname="box",modelName="",pci_bus_id=""'
G1 = 'UUID="GPU-b",gpu="1",hostname="box",modelName="NVIDIA H100",pci_bus_id="0000:02:00.0"'


def g1(extra: str, after: str = "gpu") -> str:
    """GPU 1's labels with one more, where the encoder's sorted order puts it."""
    if after == "UUID":
        return "{" + G1.replace(',gpu="1"', f',{extra},gpu="1"') + "}"
    if after == "modelName":
        return "{" + G1.replace(",pci_bus_id=", f",{extra},pci_bus_id=") + "}"
    return "{" + G1 + "," + extra + "}"


def three_cards() -> Snapshot:
    bare = GpuSample(index=0, temperature_c=40.0)
    full = GpuSample(
        index=1, uuid="GPU-b", name="NVIDIA H100", pci_bus_id="0000:02:00.0",
        power_w=250.5, power_limit_w=300.0, energy_j=12.5, sm_active_pct=50.0,
        fans_pct=[40.0, 55.0], fan_control=["manual", "auto"], throttle_reasons=["sw_power_cap"],
        limit_drift="power limit 280 W, applied 300 W",
        processes=[
            ProcessInfo(pid=10, gpu_memory_mib=100.0, power_w=20.0, container="web"),
            ProcessInfo(pid=11, gpu_memory_mib=None, power_w=5.0, container="web"),
            ProcessInfo(pid=12, gpu_memory_mib=50.0, power_w=None),
            ProcessInfo(pid=14, gpu_memory_mib=0.0, power_w=0.0, container="idle"),
        ],
    )  # fmt: skip
    lost = GpuSample(
        index=2, uuid="GPU-c", lost=True, temperature_c=90.0, fans_pct=[99.0],
        fan_control=["manual"], throttle_reasons=["hw_slowdown"], limit_drift="drifted",
        processes=[ProcessInfo(pid=13, gpu_memory_mib=1.0, power_w=1.0)],
    )  # fmt: skip
    return Snapshot(hostname="box", time=1700000000.5, simulated=True, gpus=[bare, full, lost])


def test_a_snapshot_is_written_as_exactly_these_series() -> None:
    alerts = [Alert("power_cap", 1, "capped", 1.0), Alert("gpu_lost", 2, "lost", 1.0)]
    families = snapshot_metrics(
        three_cards(),
        profile="quiet",
        runs_by_status={"succeeded": 2, "failed": 1},
        unattended={1: [0], 2: [0]},
        alerts=alerts,
        limits_left={1: "left by sweep s", 2: "left on a lost card"},
    )
    reasons = ["gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown"]
    reasons += ["sync_boost", "sw_thermal", "hw_thermal", "hw_power_brake", "display_clocks"]
    assert exposition(families) == [
        *family(
            "gpustation_alert",
            "1 while an alert condition holds (rule in the label: a GPU held but idle, "
            "thermal throttling, a GPU lost ...).",
            '{gpu="1",hostname="box",rule="power_cap",severity="warning"} 1.0',
            '{gpu="2",hostname="box",rule="gpu_lost",severity="critical"} 1.0',
        ),
        # a value a card does not report is left out, and a lost card's values too
        *family("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", f"{{{G0}}} 40.0"),
        *family("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", f"{{{G1}}} 250.5"),
        *family(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "Total energy consumption since boot (in mJ); only ever increases.",
            f"{{{G1}}} 12500.0",  # J to mJ
        ),
        *family(
            "DCGM_FI_PROF_SM_ACTIVE",
            "Ratio (0-1) of cycles an SM has at least 1 warp assigned.",
            f"{{{G1}}} 0.5",  # % to a ratio
        ),
        *family(
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
            "Current clocks event (throttle) reasons as an NVML bitmask.",
            f"{{{G1}}} 4.0",
        ),
        # gpustation's own, after the fields only dcgm-exporter writes
        *family("gpustation_power_limit_watts", "Enforced power limit (W).", f"{{{G1}}} 300.0"),
        *family(
            "gpustation_gpu_processes", "Processes using the GPU.", f"{{{G0}}} 0.0", f"{{{G1}}} 4.0"
        ),
        *family(
            "gpustation_gpu_lost",
            "1 when the GPU fell off the bus.",
            f"{{{G0}}} 0.0",
            f"{{{G1}}} 0.0",
            '{UUID="GPU-c",gpu="2",hostname="box",modelName="",pci_bus_id=""} 1.0',
        ),
        *family(
            "gpustation_fan_manual_unattended",
            "1 for a fan under manual control with no fan controller driving it.",
            g1('fan="0"', "UUID") + " 1.0",
            g1('fan="1"', "UUID") + " 0.0",
        ),
        *family(
            "gpustation_limit_drifted",
            "1 while a card's power limit (or fans) differ from what was applied last, with "
            "no journal entry to explain it (the note says what, and the command that "
            "applies it again).",
            g1('note="power limit 280 W, applied 300 W"', "modelName") + " 1.0",
        ),
        *family(
            "gpustation_power_limit_left",
            "1 while the power limit is one a killed program left changed (the note says "
            "which, and the command that puts it back).",
            g1('note="left by sweep s"', "modelName") + " 1.0",
        ),
        *family(
            "gpustation_container_power_watts",
            "Estimated power of a container's processes on the GPU, from their SM shares (W).",
            g1('container="idle"', "UUID") + " 0.0",
            g1('container="web"', "UUID") + " 25.0",  # "-" has a process without power
        ),
        *family(
            "gpustation_container_memory_used_mib",
            "VRAM held by a container's processes on the GPU (MiB).",
            g1('container="-"', "UUID") + " 50.0",  # "web" has one without memory
            g1('container="idle"', "UUID") + " 0.0",
        ),
        *family(
            "gpustation_container_processes",
            "A container's processes on the GPU.",
            g1('container="-"', "UUID") + " 1.0",
            g1('container="idle"', "UUID") + " 1.0",
            g1('container="web"', "UUID") + " 2.0",
        ),
        *family(
            "gpustation_fan_speed_percent",
            "Fan speed as a percentage of its maximum.",
            g1('fan="0"', "UUID") + " 40.0",
            g1('fan="1"', "UUID") + " 55.0",
        ),
        *family(
            "gpustation_throttle_reason",
            "1 while the clocks event (throttle) reason is active, else 0.",
            *(g1(f'reason="{r}"') + (" 1.0" if r == "sw_power_cap" else " 0.0") for r in reasons),
        ),
        *family("gpustation_gpus", "GPUs this exporter reads.", " 3.0"),
        *family(
            "gpustation_snapshot_timestamp_seconds",
            "When the exported values were sampled (Unix time).",
            " 1.7000000005e+09",
        ),
        *family("gpustation_simulated", "1: these GPUs are simulated, not real.", " 1.0"),
        *family(
            "gpustation_hardware_profile",
            "The hardware profile last applied (value 1, name in the label).",
            '{hostname="box",profile="quiet"} 1.0',
        ),
        *family(
            "gpustation_runs",
            "Runs in the run history by status.",
            '{status="failed"} 1.0',
            '{status="succeeded"} 2.0',
        ),
    ]


def test_without_extras_only_the_cards_series_are_written() -> None:
    card = GpuSample(index=0, temperature_c=40.0, throttle_reasons=None)
    snap = Snapshot(hostname="box", time=5.0, gpus=[card])
    assert exposition(snapshot_metrics(snap)) == [
        *family("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", f"{{{G0}}} 40.0"),
        *family("gpustation_gpu_processes", "Processes using the GPU.", f"{{{G0}}} 0.0"),
        *family("gpustation_gpu_lost", "1 when the GPU fell off the bus.", f"{{{G0}}} 0.0"),
        *family("gpustation_gpus", "GPUs this exporter reads.", " 1.0"),
        *family(
            "gpustation_snapshot_timestamp_seconds",
            "When the exported values were sampled (Unix time).",
            " 5.0",
        ),
    ]
    # an empty profile, no runs and no alerts are no series; no alert at all is one with none
    said = exposition(snapshot_metrics(snap, profile="", runs_by_status={}, alerts=[]))
    assert [line for line in said if "gpustation_alert" in line] == [
        "# HELP gpustation_alert 1 while an alert condition holds (rule in the label: a GPU "
        "held but idle, thermal throttling, a GPU lost ...).",
        "# TYPE gpustation_alert gauge",
    ]
    assert not [line for line in said if "profile" in line or "runs" in line]


def test_a_sample_that_fails_keeps_the_last_values_and_says_why() -> None:
    first, last = three_cards(), three_cards()
    last.gpus[0].temperature_c = 41.0
    results: list[Snapshot | Exception] = [first, RuntimeError("NVML gone"), RuntimeError(), last]

    def sample() -> Snapshot:
        result = results.pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    raised = [("gpu_lost", 2), ("limit_drifted", 1), ("power_cap", 1)]
    exporter = Exporter(sample, with_extras=False)
    exporter.sample_once()
    assert exporter.samples_taken == 1 and exporter.latest().error is None
    assert [(a.rule, a.gpu) for a in exporter.latest().alerts or []] == raised
    exporter.sample_once()
    latest = exporter.latest()
    assert latest.snapshot is first and latest.error == "NVML gone"
    assert [(a.rule, a.gpu) for a in latest.alerts or []] == raised
    m = scrape(exporter)
    assert m["gpustation_up"] == {(): 0.0}  # said, while the last values stay
    assert list(by_gpu(m["DCGM_FI_DEV_GPU_TEMP"]).values()) == [40.0]
    exporter.sample_once()
    assert exporter.latest().error == "RuntimeError()"  # an error without words is named
    assert exporter.samples_taken == 1  # only samples taken count
    exporter.sample_once()
    latest = exporter.latest()
    assert latest.snapshot is last and latest.error is None and exporter.samples_taken == 2
    m = scrape(exporter)
    assert m["gpustation_up"] == {(): 1.0}
    assert list(by_gpu(m["DCGM_FI_DEV_GPU_TEMP"]).values()) == [41.0]


class Heard:
    """A notifier that keeps what it was handed."""

    def __init__(self) -> None:
        self.taken: list[tuple[list[tuple[str, int]], str | None]] = []

    def take(self, alerts: list[Alert], hostname: str | None) -> list[str]:
        self.taken.append((sorted((a.rule, a.gpu) for a in alerts), hostname))
        return []


def test_each_alert_a_sample_raises_is_handed_to_the_notifier_once() -> None:
    heard = Heard()
    exporter = Exporter(three_cards, with_extras=False, alert_notifier=heard)  # type: ignore[arg-type]
    exporter.sample_once()
    raised = [("gpu_lost", 2), ("limit_drifted", 1), ("power_cap", 1)]  # sorted
    assert heard.taken == [(raised, "box")]
    exporter.sample_once()  # the same cards: nothing new to say
    assert heard.taken == [(raised, "box")]
    m = scrape(exporter)
    assert {(dict(k)["rule"], dict(k)["severity"]) for k in m["gpustation_alert"]} == {
        ("gpu_lost", "critical"),
        ("limit_drifted", "warning"),
        ("power_cap", "warning"),
    }


def test_a_drifted_limit_is_marked_on_the_card_only_with_the_extras(sim: SimBackend) -> None:
    uuid0 = sim.read_gpus([0], slow=False)[0].uuid
    entry = journal.record(
        gpu=0, uuid=uuid0, what=journal.POWER_LIMIT, previous=450.0, new=315.0,
        command="gpustation profile apply quiet", simulated=True,
    )  # fmt: skip
    journal.settle(entry, journal.MADE, read_back=315.0)  # the card keeps 450 W: drifted
    for with_extras, want in ((True, ["0"]), (False, [])):
        exporter = Exporter(Sampler(sim, with_host=False).sample, with_extras=with_extras)
        exporter.sample_once()
        drifted = scrape(exporter).get("gpustation_limit_drifted", {})
        assert [gpu for gpu, _note in by_gpu(drifted, "note")] == want


def test_a_sample_renders_once_per_format_and_keeps_no_older_rendering() -> None:
    exporter = Exporter(three_cards, with_extras=False)
    for _ in range(3):
        exporter.sample_once()
        text = exporter.rendered(generate_latest)
        assert exporter.rendered(openmetrics.generate_latest) != text
    assert len(exporter._rendered) == 2  # this sample's two renderings, no more


def test_samples_keep_to_the_interval_and_a_slow_one_is_not_made_up_for() -> None:
    interval_s = 0.05
    taken: list[float] = []

    def sample() -> Snapshot:
        taken.append(time.monotonic())
        if len(taken) == 3:
            time.sleep(6 * interval_s)  # a card slow to answer, once
        return three_cards()

    exporter = Exporter(sample, interval_s=interval_s, with_extras=False)
    exporter.start()
    try:
        deadline = time.monotonic() + 30
        while len(taken) < 8:
            assert time.monotonic() < deadline, "timed out waiting for 8 samples"
            time.sleep(0.01)
    finally:
        exporter.stop()
    # never ahead of the schedule (each waits for its turn) ...
    assert taken[2] - taken[0] >= 1.5 * interval_s
    # ... and after the slow one, the next at once and then one an interval, not a burst
    assert taken[3] - taken[2] < 6 * interval_s + 2.0  # a loaded host may lag a little
    assert taken[5] - taken[3] >= 1.5 * interval_s


def test_before_the_first_sample_the_exporter_is_not_up_and_says_nothing_else() -> None:
    exporter = Exporter(three_cards, with_extras=False)
    assert scrape(exporter) == {"gpustation_up": {(): 0.0}}
    exporter.sample_once()
    assert scrape(exporter)["gpustation_up"] == {(): 1.0}


def test_an_exporter_never_started_stops_without_a_word() -> None:
    Exporter(three_cards, with_extras=False).stop()  # a serve that failed before starting it


def test_the_idle_rule_is_the_one_config_toml_gives(gpustation_dirs: dict[str, Path]) -> None:
    (gpustation_dirs["config"] / "config.toml").write_text(
        "[alerts]\nidle_min_gib = 1\nidle_max_util_pct = 5\nidle_minutes = 0\n"
    )
    held = GpuSample(
        index=0, utilization_gpu_pct=0.0,
        processes=[ProcessInfo(pid=10, gpu_memory_mib=2048.0)],
    )  # fmt: skip
    exporter = Exporter(lambda: Snapshot(hostname="box", time=5.0, gpus=[held]), with_extras=False)
    exporter.sample_once()  # held and idle for 0 minutes: at once, not after the default 10
    assert [(a.rule, a.gpu) for a in exporter.latest().alerts or []] == [("gpu_idle_held", 0)]
