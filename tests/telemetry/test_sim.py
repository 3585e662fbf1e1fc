"""The simulated GPUs' physics and shared state."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpustation.errors import GpustationError, NotSupportedError
from gpustation.telemetry.model import GpuSample
from gpustation.telemetry.sampler import Sampler
from gpustation.telemetry.sim import SimBackend
from gpustation.telemetry.sim_cards import CARDS


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _settle(backend: SimBackend, clock: Clock, seconds: float = 300.0) -> GpuSample:
    clock.t += seconds
    return backend.read_gpus([0], slow=True)[0]


def test_power_is_capped_at_the_enforced_limit_and_throttle_reported() -> None:
    clock = Clock()
    sim = SimBackend(count=1, card="rtx4090", clock=clock)
    sim.poke(0, load=1.0)
    g = _settle(sim, clock)
    assert g.power_w == pytest.approx(g.power_limit_w)
    assert g.throttle_reasons is not None and "sw_power_cap" in g.throttle_reasons
    uncapped_clock = g.clock_sm_mhz
    assert uncapped_clock is not None

    sim.control.set_power_limit(0, 300)
    g = _settle(sim, clock)
    assert g.power_w == pytest.approx(300)
    assert g.clock_sm_mhz is not None and g.throttle_reasons is not None
    assert g.clock_sm_mhz < uncapped_clock  # a lower cap costs clock speed
    assert "sw_power_cap" in g.throttle_reasons


def test_idle_card_is_not_power_capped() -> None:
    clock = Clock()
    sim = SimBackend(count=1, clock=clock)
    sim.poke(0, load=0.0)
    g = _settle(sim, clock)
    assert g.power_w is not None and g.power_w < 50
    assert g.throttle_reasons == ["gpu_idle"]
    assert g.processes == []


def test_temperature_falls_with_more_fan() -> None:
    clock = Clock()
    sim = SimBackend(count=1, clock=clock)
    sim.poke(0, load=0.8)
    for fan in range(2):
        sim.control.set_fan_speed(0, fan, 30)
    slow_fans = _settle(sim, clock)
    for fan in range(2):
        sim.control.set_fan_speed(0, fan, 100)
    fast_fans = _settle(sim, clock)
    assert fast_fans.fans_pct == [100, 100]
    assert fast_fans.fan_control == ["manual", "manual"]
    assert fast_fans.temperature_c is not None and slow_fans.temperature_c is not None
    assert fast_fans.temperature_c < slow_fans.temperature_c - 5


def test_hot_card_throttles_near_slowdown() -> None:
    clock = Clock()
    sim = SimBackend(count=1, clock=clock)
    sim.poke(0, load=1.0, ambient_c=55.0)
    sim.control.set_power_limit(0, 600)
    for fan in range(2):
        sim.control.set_fan_speed(0, fan, 30)
    g = _settle(sim, clock, 600)
    assert g.temperature_c is not None and g.temperature_slowdown_c is not None
    assert g.temperature_c >= g.temperature_slowdown_c - 2
    assert g.throttle_reasons is not None and "sw_thermal" in g.throttle_reasons
    assert g.clock_sm_mhz is not None and g.clock_sm_mhz < CARDS["rtx4090"].clock_sm_max_mhz


def test_state_is_shared_between_backends_through_the_file(tmp_path: Path) -> None:
    path = tmp_path / "sim.json"
    a = SimBackend(count=2, state_path=path)
    b = SimBackend(count=2, state_path=path)
    a.control.set_power_limit(1, 333)
    assert b.read_gpus([1], slow=False)[0].power_limit_w == 333
    a.control.set_fan_speed(0, 1, 55)
    assert b.read_gpus([0], slow=False)[0].fan_control == ["auto", "manual"]
    a.control.set_fan_auto(0, 1)
    assert b.read_gpus([0], slow=False)[0].fan_control == ["auto", "auto"]


def test_same_seed_same_world_other_seed_other_world() -> None:
    def utils(seed: int) -> list[float | None]:
        clock = Clock()
        sim = SimBackend(count=4, seed=seed, clock=clock)
        out = []
        for _ in range(20):
            clock.t += 30
            out += [g.utilization_gpu_pct for g in sim.read_gpus(range(4), slow=False)]
        return out

    assert utils(1) == utils(1)
    assert utils(1) != utils(2)


def test_datacenter_card_has_no_fans() -> None:
    sim = SimBackend(count=1, card="h200", clock=Clock())
    g = sim.read_gpus([0], slow=True)[0]
    assert g.fans_pct == [] and g.fan_control == []
    assert (g.power_min_w, g.power_max_w, g.power_default_w) == (200, 700, 700)
    with pytest.raises(NotSupportedError):
        sim.control.set_fan_speed(0, 0, 50)


def test_counters_a_reader_does_not_show_are_left_out() -> None:
    sim = SimBackend(count=1, card="h200", clock=Clock())
    g = sim.read_gpus([0], slow=True)[0]
    assert g.ecc_uncorrected == 0 and g.energy_j is not None
    sim.read_ecc = sim.read_energy = False
    g = sim.read_gpus([0], slow=True)[0]
    assert g.ecc_uncorrected is None and g.energy_j is None
    assert g.temperature_c is not None


def test_limits_outside_the_card_range_are_refused() -> None:
    sim = SimBackend(count=1, clock=Clock())
    with pytest.raises(GpustationError, match="150-600 W"):
        sim.control.set_power_limit(0, 700)
    with pytest.raises(GpustationError, match="30-100"):
        sim.control.set_fan_speed(0, 0, 10)


def test_lost_gpu_is_marked_and_others_keep_reporting() -> None:
    clock = Clock()
    sim = SimBackend(count=2, clock=clock)
    sim.poke(1, lost=True)
    snap = Sampler(sim, with_host=False).sample()
    assert snap.simulated
    assert snap.gpus[1].lost and snap.gpus[1].temperature_c is None
    assert not snap.gpus[0].lost and snap.gpus[0].temperature_c is not None


def test_topology_pairs_and_placement() -> None:
    sim = SimBackend(count=4, clock=Clock())
    topo = sim.topology(range(4))
    assert len(topo.links) == 6
    near, far = topo.link(0, 1), topo.link(0, 3)
    assert near is not None and near.level == "PIX"
    assert far is not None and far.level == "SYS" and far.p2p_read is False
    assert [p.numa_node for p in topo.gpus] == [0, 0, 1, 1]


def test_gpm_tensor_activity_under_load_none_idle_and_only_when_asked() -> None:
    clock = Clock()
    sim = SimBackend(count=2, card="h200", clock=clock)
    sim.poke(0, load=1.0)
    sim.poke(1, load=0.0)
    clock.t += 60
    busy, idle = sim.read_gpus([0, 1], slow=True)
    assert busy.tensor_active_pct is None  # not asked for
    sim.read_gpm = True
    busy, idle = sim.read_gpus([0, 1], slow=True)
    assert busy.tensor_active_pct and busy.tensor_active_pct > 30
    assert busy.sm_active_pct and busy.sm_active_pct > 80
    assert (idle.tensor_active_pct, idle.sm_active_pct, idle.dram_active_pct) == (0, 0, 0)
    assert busy.utilization_gpu_pct is not None
    assert busy.processes and busy.processes[0].sm_pct == pytest.approx(
        busy.utilization_gpu_pct * 0.8, abs=1
    )
    assert busy.nvlink is not None and len(busy.nvlink) == 18 and busy.nvlink[0].tx_kib_s
    assert busy.mig is not None and busy.mig.enabled is False
    assert busy.remapped_rows.pending is False
    # An RTX 4090 has no GPM, no MIG and no NVLink.
    rtx = SimBackend(count=1, card="rtx4090", clock=clock)
    rtx.read_gpm = True
    g = rtx.read_gpus([0], slow=True)[0]
    assert (g.tensor_active_pct, g.mig, g.nvlink, g.remapped_rows.pending) == (None, None, [], None)


def test_no_xid_unless_poked() -> None:
    clock = Clock()
    sim = SimBackend(count=2, card="h200", clock=clock)
    assert [g.xid_events for g in sim.read_gpus([0, 1], slow=False)] == [[], []]
    sim.poke(1, xid=79)
    g0, g1 = sim.read_gpus([0, 1], slow=False)
    assert g0.xid_events == []
    assert [(e.code, e.meaning) for e in g1.xid_events or ()] == [
        (79, "GPU has fallen off the bus")
    ]
    with pytest.raises(ValueError):
        sim.poke(0, nonsense=1)


def test_the_sampler_turns_gpm_on_and_off_through_its_backend() -> None:
    sim = SimBackend(count=1, card="h200", clock=Clock())
    sim.poke(0, load=1.0)
    sampler = Sampler(sim, with_host=False, with_topology=False)
    assert sampler.read_gpm is False and sampler.sample().gpus[0].tensor_active_pct is None
    sampler.read_gpm = True
    assert sim.read_gpm is True and sampler.sample().gpus[0].tensor_active_pct


def test_an_idle_holder_is_shared_through_the_state_file_and_counts_as_used_memory(
    tmp_path: Path,
) -> None:
    clock = Clock()
    path = tmp_path / "sim.json"
    poker = SimBackend(count=2, state_path=path, clock=clock)
    poker.poke(1, load=0.0, idle_holder_mib=4096)
    poker.poke(0, load=0.0)
    reader = SimBackend(count=2, state_path=path, clock=clock)  # another process, as it were
    g0, g1 = reader.read_gpus([0, 1], slow=False)
    assert g0.processes == []
    (holder,) = g1.processes
    assert holder.gpu_memory_mib == 4096.0 and holder.user == "sim"
    assert g1.memory_used_mib == (g0.memory_used_mib or 0) + 4096.0
    assert g1.utilization_gpu_pct == 0
    poker.poke(1, idle_holder_mib=None)
    assert reader.read_gpus([1], slow=False)[0].processes == []
    for bad in (-1, "4GiB", True):
        with pytest.raises(ValueError, match="idle_holder_mib"):
            poker.poke(1, idle_holder_mib=bad)


@pytest.mark.parametrize("card", sorted(CARDS))
@pytest.mark.parametrize("load", [0.0, 1.0])
def test_simulated_vram_is_what_the_listed_processes_hold(card: str, load: float) -> None:
    from gpustation.telemetry.table import render_snapshot

    sim = SimBackend(count=2, card=card, clock=Clock())
    for i in (0, 1):
        sim.poke(i, load=load)
    snap = Sampler(sim, with_host=False, with_topology=False).sample()
    for g in snap.gpus:
        assert g.memory_used_mib == sum(p.gpu_memory_mib or 0 for p in g.processes)
        assert g.unowned_memory_mib == 0 and g.device_holders == []
        assert bool(g.processes) == (load > 0)
    assert "held by no listed process" not in render_snapshot(snap)


def test_orphaned_memory_and_holders_are_simulated_only_when_poked() -> None:
    from gpustation.telemetry.table import render_snapshot

    sim = SimBackend(count=1, card="h200", clock=Clock())
    sim.poke(0, load=0.0, orphaned_mib=3277, holders=[(4321, "python stuck.py")])
    snap = Sampler(sim, with_host=False, with_topology=False).sample()
    g = snap.gpus[0]
    assert g.memory_used_mib == 3277 and g.unowned_memory_mib == 3277
    assert [(p.pid, p.kind, p.command) for p in g.device_holders or []] == [
        (4321, "holder", "python stuck.py")
    ]
    line = next(ln for ln in render_snapshot(snap).splitlines() if "held by no listed" in ln)
    assert line.startswith("GPU 0: 3.2G of VRAM") and "held open by 4321 (python stuck.py)" in line
    sim.poke(0, orphaned_mib=0, holders=[])
    g = Sampler(sim, with_host=False, with_topology=False).sample().gpus[0]
    assert g.unowned_memory_mib == 0 and g.device_holders == []


def test_a_saved_state_with_malformed_holders_starts_afresh(tmp_path: Path) -> None:
    import json

    path = tmp_path / "sim.json"
    sim = SimBackend(count=1, card="rtx4090", clock=Clock(), state_path=path)
    sim.poke(0, holders=[(4321, "python stuck.py")])
    state = json.loads(path.read_text())
    assert state["gpus"][0]["holders"] == [[4321, "python stuck.py"]]
    state["gpus"][0]["holders"] = [["not a pid"]]
    path.write_text(json.dumps(state))
    again = SimBackend(count=1, card="rtx4090", clock=Clock(), state_path=path)
    assert again.read_gpus([0], slow=True)[0].device_holders == []


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("power_limit_w", -100),
        ("power_limit_w", 1e9),
        ("temperature_c", float("inf")),
        ("load", 50),
        ("fan_manual_pct", [5000.0, 30.0]),
        ("energy_j", -1.0),
        ("xid", [["yesterday", 79]]),
        ("xid", [[1.0, "79"]]),
        ("xid", [[1.0]]),
    ],
)
def test_a_saved_state_with_a_value_out_of_range_starts_afresh(
    tmp_path: Path, key: str, value: object
) -> None:
    """A hand-edited state file's values are checked where they are read: a
    bad XID entry never crashes a read, and an impossible limit, temperature,
    load or fan speed is never shown as given."""
    import json

    path = tmp_path / "sim.json"
    clock = Clock()
    SimBackend(count=1, card="rtx4090", clock=clock, state_path=path).poke(0, xid=79)
    state = json.loads(path.read_text())
    state["gpus"][0][key] = value
    # json writes inf as Infinity, as a hand-edited file may hold it
    path.write_text(json.dumps(state))
    sim = SimBackend(count=1, card="rtx4090", clock=clock, state_path=path)
    g = sim.read_gpus([0], slow=True)[0]
    spec = CARDS["rtx4090"]
    assert g.power_limit_w == spec.power_default_w
    assert g.temperature_c is not None and g.temperature_c < 150
    assert g.utilization_gpu_pct is not None and 0 <= g.utilization_gpu_pct <= 100
    assert all(0 <= f <= 100 for f in g.fans_pct or ())
    assert g.xid_events == []  # afresh: the poked XID went with the bad state


def test_a_saved_state_in_range_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "sim.json"
    clock = Clock()
    SimBackend(count=1, card="rtx4090", clock=clock, state_path=path).control.set_power_limit(
        0, 300
    )
    again = SimBackend(count=1, card="rtx4090", clock=clock, state_path=path)
    assert again.read_gpus([0], slow=False)[0].power_limit_w == 300


def test_a_knob_out_of_range_is_refused_and_changes_nothing() -> None:
    sim = SimBackend(count=1, card="rtx4090", clock=Clock())
    sim.poke(0, ambient_c=85.0, load=1.0)  # a hot room is a real one
    with pytest.raises(ValueError, match="out of range"):
        sim.poke(0, load=50)
    with pytest.raises(ValueError, match="out of range"):
        sim.poke(0, ambient_c=float("inf"))
    g = sim.read_gpus([0], slow=False)[0]
    assert g.utilization_gpu_pct == 100


def test_a_link_poked_down_reads_below_its_maximum_until_it_is_given_back(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sim.json"
    sim = SimBackend(count=1, card="h200", state_path=path)
    sim.poke(0, load=0.8)
    assert not sim.read_gpus([0], slow=False)[0].pcie.below_max
    # Another process (a test) pokes the shared machine; this one reads it.
    SimBackend(count=1, card="h200", state_path=path).poke(0, pcie_gen=3, pcie_width=8)
    link = sim.read_gpus([0], slow=False)[0].pcie
    assert (link.gen, link.width, link.max_gen, link.max_width) == (3, 8, 5, 16)
    assert link.below_max
    sim.poke(0, pcie_gen=None, pcie_width=None)
    link = sim.read_gpus([0], slow=False)[0].pcie
    assert (link.gen, link.width) == (5, 16) and not link.below_max
    with pytest.raises(ValueError, match="out of range"):
        sim.poke(0, pcie_gen=6)  # an H200 is Gen5
