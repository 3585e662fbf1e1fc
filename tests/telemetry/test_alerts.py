"""Alert rules: raised when a condition starts, not on every tick."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpustation.telemetry.alerts import Alert, AlertLog, IdleRule, evaluate, topology_findings
from gpustation.telemetry.model import (
    GpuLink,
    GpuSample,
    PcieInfo,
    ProcessInfo,
    Snapshot,
    Topology,
)
from gpustation.telemetry.sampler import Sampler
from gpustation.telemetry.sim import SimBackend
from gpustation.telemetry.sim_cards import IDLE_HOLDER, IDLE_HOLDER_PID


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def gpu(index: int = 0, **kw: object) -> GpuSample:
    base: dict[str, object] = dict(
        temperature_c=60.0,
        temperature_slowdown_c=87.0,
        power_w=200.0,
        power_limit_w=450.0,
        memory_used_mib=1000.0,
        memory_total_mib=24000.0,
        utilization_gpu_pct=50.0,
        throttle_reasons=[],
        pcie=PcieInfo(gen=4, width=16, max_gen=4, max_width=16),
        ecc_uncorrected=0,
    )
    base.update(kw)
    return GpuSample(index=index, **base)  # type: ignore[arg-type]


def snap(t: float, *gpus: GpuSample, topology: Topology | None = None) -> Snapshot:
    return Snapshot(hostname="h", time=t, gpus=list(gpus), topology=topology or Topology())


def rules(alerts: Iterable[Alert]) -> set[tuple[str, int]]:
    return {(a.rule, a.gpu) for a in alerts}


def test_a_healthy_gpu_raises_nothing() -> None:
    assert evaluate(None, snap(0, gpu())) == []


def test_each_rule_fires_on_its_condition() -> None:
    cur = snap(
        1,
        gpu(0, temperature_c=83.0),  # 4 C from slowdown
        gpu(1, throttle_reasons=["sw_thermal"]),
        gpu(2, throttle_reasons=["sw_power_cap"]),
        gpu(3, pcie=PcieInfo(gen=1, width=16, max_gen=4, max_width=16), utilization_gpu_pct=90.0),
        gpu(4, memory_used_mib=23_000.0),  # 95.8 %
        gpu(5, lost=True),
    )
    assert rules(evaluate(None, cur)) == {
        ("temp_near_slowdown", 0),
        ("thermal_throttle", 1),
        ("power_cap", 2),
        ("pcie_below_max", 3),
        ("vram_high", 4),
        ("gpu_lost", 5),
    }


def test_thresholds_are_exclusive_where_the_issue_says_above() -> None:
    cur = snap(
        1,
        gpu(0, temperature_c=81.9),  # 5.1 C away
        gpu(1, memory_used_mib=22_800.0),  # exactly 95 %
        gpu(2, throttle_reasons=["gpu_idle"]),  # benign reason
    )
    assert evaluate(None, cur) == []


def test_slow_pcie_link_at_idle_is_power_saving_not_an_alert() -> None:
    idle = gpu(pcie=PcieInfo(gen=1, width=16, max_gen=4, max_width=16), utilization_gpu_pct=0.0)
    assert evaluate(None, snap(0, idle)) == []


def test_a_condition_is_raised_once_while_it_lasts() -> None:
    hot = gpu(throttle_reasons=["sw_power_cap"])
    first = evaluate(snap(0, gpu()), snap(1, hot))
    assert rules(first) == {("power_cap", 0)}
    assert evaluate(snap(1, hot), snap(2, hot)) == []


def test_uncorrected_ecc_alerts_only_when_the_count_grows() -> None:
    before = snap(0, gpu(ecc_uncorrected=2))
    assert evaluate(None, before) == []  # no baseline yet: old errors are not new
    after = snap(1, gpu(ecc_uncorrected=5))
    (alert,) = evaluate(before, after)
    assert alert.rule == "ecc_uncorrected" and "3 new uncorrected ECC errors" in alert.message
    assert evaluate(after, snap(2, gpu(ecc_uncorrected=5))) == []


def test_a_gpu_that_disappears_is_lost() -> None:
    before = snap(0, gpu(0), gpu(1))
    after = snap(1, gpu(0))
    assert rules(evaluate(before, after)) == {("gpu_lost", 1)}


def test_alert_log_keeps_active_alerts_and_quiets_flapping() -> None:
    log = AlertLog(repeat_quiet_s=60.0)
    hot = gpu(throttle_reasons=["sw_power_cap"])
    assert rules(log.update(snap(0, hot))) == {("power_cap", 0)}
    assert rules(log.active) == {("power_cap", 0)}
    assert log.update(snap(1, hot)) == []
    log.update(snap(2, gpu()))
    assert log.active == []
    assert log.update(snap(3, hot)) == []  # back within a minute: not logged again
    assert rules(log.active) == {("power_cap", 0)}
    log.update(snap(4, gpu()))
    assert rules(log.update(snap(100, hot))) == {("power_cap", 0)}
    # the start at 0, its end at 2 (the flap at 3-4 is quiet), the start at 100
    assert [(a.time, a.cleared) for a in log.log] == [(0, False), (2, True), (100, False)]
    assert "cleared (after 2 s)" in log.log[1].message


def test_alert_log_keeps_a_vanished_gpu_and_ecc_errors_active() -> None:
    log = AlertLog()
    log.update(snap(0, gpu(0), gpu(1, ecc_uncorrected=0)))
    log.update(snap(1, gpu(0), gpu(1, ecc_uncorrected=1)))
    log.update(snap(2, gpu(0)))
    log.update(snap(3, gpu(0)))
    assert rules(log.active) == {("gpu_lost", 1), ("ecc_uncorrected", 1)}
    assert log.active[0].severity == "critical"


def test_topology_findings_name_sys_pairs_and_slow_links_in_words() -> None:
    topo = Topology(links=[GpuLink(0, 1, "SYS", False, False), GpuLink(0, 2, "PIX", True, True)])
    slow = gpu(1, pcie=PcieInfo(gen=3, width=8, max_gen=4, max_width=16), utilization_gpu_pct=80.0)
    found = topology_findings(snap(0, gpu(0), slow, gpu(2), topology=topo))
    text = "\n".join(found)
    assert "GPU 0 and GPU 1 only meet across the CPU interconnect (SYS)" in text
    assert "peer-to-peer" not in text  # said once, as SYS
    assert "GPU 1 PCIe runs at Gen3 x8, below its maximum Gen4 x16 while 80 % busy" in text
    assert "GPU 2" not in text


def _held(t: float, util: float, mib: float = 8192.0) -> Snapshot:
    gpu = GpuSample(
        index=0,
        utilization_gpu_pct=util,
        memory_used_mib=mib + 400,
        memory_total_mib=24564,
        processes=[
            ProcessInfo(
                pid=4242, gpu_memory_mib=mib, user="alice", command="python -m ipykernel_launcher"
            )
        ],
    )
    return Snapshot(hostname="h", time=t, gpus=[gpu])


def test_a_gpu_held_but_idle_is_an_alert_after_the_rule_s_minutes() -> None:
    log = AlertLog(idle=IdleRule(min_gib=1, max_util_pct=5, minutes=10))
    assert log.update(_held(0, util=0)) == []
    assert log.update(_held(9 * 60, util=2)) == []
    (alert,) = log.update(_held(10 * 60, util=1))
    assert alert.rule == "gpu_idle_held" and alert.gpu == 0
    assert "alice" in alert.message and "ipykernel" in alert.message and "8.0 GiB" in alert.message
    # busy again: the condition clears, and the clock starts over
    assert log.update(_held(11 * 60, util=80)) == []
    assert log.update(_held(12 * 60, util=0)) == []
    assert all(a.rule != "gpu_idle_held" for a in log.active)


def test_the_idle_rule_on_simulated_gpus_through_the_sampler() -> None:
    """A simulated process holding memory on an idle card, sampled as the dashboard
    and the exporter sample, on a clock the test moves."""
    clock = Clock()
    backend = SimBackend(count=2, state_path=None, clock=clock)
    sampler = Sampler(backend, with_host=False, clock=clock)
    backend.poke(0, load=0.0, idle_holder_mib=6 * 1024)  # a kernel that went quiet
    backend.poke(1, load=0.0, idle_holder_mib=512)  # too little to count
    log = AlertLog(idle=IdleRule(min_gib=1, max_util_pct=5, minutes=10))
    holder = next(p for p in sampler.sample().gpus[0].processes if p.pid == IDLE_HOLDER_PID)
    assert holder.gpu_memory_mib == 6 * 1024 and holder.user == "sim"
    assert log.update(sampler.sample()) == []
    for _ in range(9):
        clock.t += 60.0
        assert log.update(sampler.sample()) == []  # not yet ten minutes
    clock.t += 60.0
    (alert,) = log.update(sampler.sample())
    assert alert.rule == "gpu_idle_held" and alert.gpu == 0
    assert f"pid {IDLE_HOLDER_PID} (sim: {IDLE_HOLDER[1]}) holds 6.0 GiB" in alert.message
    assert [(a.rule, a.gpu) for a in log.active] == [("gpu_idle_held", 0)]
    clock.t += 60.0
    assert log.update(sampler.sample()) == []  # raised once, not on every tick
    # the process goes: the alert clears, and the log says so
    backend.poke(0, idle_holder_mib=None)
    clock.t += 5.0
    assert log.update(sampler.sample()) == []
    assert log.active == []
    assert log.log[-1].cleared and log.log[-1].rule == "gpu_idle_held"
    # back, it holds for ten minutes again before it counts
    backend.poke(0, idle_holder_mib=6 * 1024)
    clock.t += 120.0
    assert log.update(sampler.sample()) == []


def test_a_busy_simulated_gpu_with_a_holder_is_not_idle_held() -> None:
    clock = Clock()
    backend = SimBackend(count=1, state_path=None, clock=clock)
    sampler = Sampler(backend, with_host=False, clock=clock)
    backend.poke(0, load=1.0, idle_holder_mib=6 * 1024)
    log = AlertLog(idle=IdleRule(min_gib=1, max_util_pct=5, minutes=1))
    for _ in range(5):
        assert all(a.rule != "gpu_idle_held" for a in log.update(sampler.sample()))
        clock.t += 60.0


def test_small_holders_and_busy_gpus_are_not_idle_held() -> None:
    log = AlertLog(idle=IdleRule(min_gib=1, max_util_pct=5, minutes=1))
    for t in range(0, 600, 60):
        assert log.update(_held(t, util=0, mib=512)) == []  # under 1 GiB
    log = AlertLog(idle=IdleRule(min_gib=1, max_util_pct=5, minutes=1))
    for t in range(0, 600, 60):
        assert log.update(_held(t, util=50)) == []  # the GPU works


def test_the_idle_rule_comes_from_the_alerts_table(gpustation_dirs: dict[str, Any]) -> None:
    import pytest

    from gpustation.errors import UsageError
    from gpustation.telemetry.alerts import load_idle_rule

    config = gpustation_dirs["config"] / "config.toml"
    assert load_idle_rule() == IdleRule()
    config.write_text("[alerts]\nidle_min_gib = 4\nidle_minutes = 30\n")
    assert load_idle_rule() == IdleRule(min_gib=4, max_util_pct=5, minutes=30)
    config.write_text('[alerts]\nidle_minutes = "soon"\nidle_typo = 1\n')
    with pytest.raises(UsageError, match=r"idle_minutes.*idle_typo"):
        load_idle_rule()


# ---- XIDs and remapped rows ------------------------------------------------------------


def test_each_new_xid_is_one_critical_alert_and_an_old_one_is_not_raised_again() -> None:
    from gpustation.telemetry.model import XidEvent

    first = XidEvent(time=10.0, code=13, meaning="graphics engine exception")
    second = XidEvent(time=12.0, code=79, meaning="GPU has fallen off the bus")
    log = AlertLog()
    assert log.update(snap(9, gpu(0, xid_events=[]))) == []
    raised = log.update(snap(11, gpu(0, xid_events=[first])))
    assert [(a.rule, a.severity) for a in raised] == [("xid", "critical")]
    assert "XID 13" in raised[0].message and "graphics engine" in raised[0].message
    # The same event in the next snapshot is not news; a newer one is.
    assert log.update(snap(11.5, gpu(0, xid_events=[first]))) == []
    raised = log.update(snap(13, gpu(0, xid_events=[first, second])))
    assert [a.message for a in raised] == ["GPU 0 reported XID 79: GPU has fallen off the bus"]
    # It stays among the active alerts, as an ECC error does.
    assert [a.rule for a in log.active] == ["xid"]
    # Not watched (None) raises nothing.
    assert evaluate(None, snap(1, gpu(0, xid_events=None))) == []


def test_a_pending_row_remap_warns_and_a_failed_one_is_critical() -> None:
    from gpustation.telemetry.model import RemappedRows

    cur = snap(
        1,
        gpu(0, remapped_rows=RemappedRows(0, 1, True, False)),
        gpu(1, remapped_rows=RemappedRows(0, 3, False, True)),
        gpu(2, remapped_rows=RemappedRows(None, None, None, None)),
    )
    alerts = {(a.rule, a.gpu): a for a in evaluate(None, cur)}
    assert set(alerts) == {("row_remap_pending", 0), ("row_remap_failure", 1)}
    assert alerts[("row_remap_pending", 0)].severity == "warning"
    assert alerts[("row_remap_failure", 1)].severity == "critical"
    assert "reset the GPU" in alerts[("row_remap_pending", 0)].message
