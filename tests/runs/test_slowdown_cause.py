"""Naming a slowdown's cause from built evidence: every kind, their order, and never a guess."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from gpustation.runs.slowdown.cause import name_cause
from gpustation.runs.slowdown.clues import Clues, OtherRun
from gpustation.runs.slowdown.evidence import GpuEvidence, HostEvidence, Moment, ProcessShare
from gpustation.runs.slowdown.run_rules import phase_seconds

T0 = 1_700_000_000.0
RUN_PID = 100
RUN_PROCESS = ProcessShare(RUN_PID, 90.0, "alice", "python train.py")


def healthy_gpu() -> GpuEvidence:
    return GpuEvidence(
        index=0,
        clock_sm_mhz=1980.0,
        clock_sm_max_mhz=1980.0,
        temperature_c=60.0,
        temperature_slowdown_c=89.0,
        memory_temperature_c=62.0,
        memory_temperature_max_c=95.0,
        pcie_gen=5,
        pcie_width=16,
        pcie_max_gen=5,
        pcie_max_width=16,
        utilization_pct=97.0,
        power_w=520.0,
        power_limit_w=700.0,
        processes=(RUN_PROCESS,),
    )


def healthy_host() -> HostEvidence:
    return HostEvidence(
        cpu_pct=40.0,
        cores=16,
        swap_in_mib_s=0.0,
        swap_out_mib_s=0.0,
        run_cpu=((RUN_PID, 100.0),),
        main_pid=RUN_PID,
        run_on_cpu_pct=95.0,
    )


def clues(
    gpu: dict[str, Any] | None = None, host: dict[str, Any] | None = None, **more: Any
) -> Clues:
    """20 steady seconds, then 6 seconds of the drop with ``gpu`` and ``host`` changed."""
    before = [Moment(T0 + i, (healthy_gpu(),), healthy_host()) for i in range(20)]
    slowed_gpu = replace(healthy_gpu(), **(gpu or {}))
    slowed_host = replace(healthy_host(), **(host or {}))
    during = [Moment(T0 + 20 + i, (slowed_gpu,), slowed_host) for i in range(6)]
    values: dict[str, Any] = {"gpus": (0,), "run_pids": frozenset({RUN_PID})}
    values.update(more)
    return Clues(before=before, during=during, **values)


BURNER = ProcessShare(4242, 45.0, "bob", "python burn.py")
#: each cause as the evidence of a drop: (changes to the GPU, to the host, to the clues)
CAUSES: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "phase": ({}, {}, {"phases": (("train", 5.0), ("checkpoint", 6.0)), "phase_window_s": 11.0}),
    "power_cap": ({"throttle": ("sw_power_cap",), "power_w": 699.6, "clock_sm_mhz": 1410.0}, {},
                  {}),
    "other_run": ({}, {}, {"other_runs": (OtherRun("20260101-000000-b-1a2b", (0,), T0 + 21.0),)}),
    "process": ({"processes": (replace(RUN_PROCESS, sm_pct=50.0), BURNER)}, {}, {}),
    "pcie": ({"pcie_gen": 3}, {}, {}),
    "clocks": ({"clock_sm_mhz": 1410.0}, {}, {}),
    "memory_temperature": ({"memory_temperature_c": 93.0}, {}, {}),
    "swap": ({}, {"swap_in_mib_s": 40.0, "swap_out_mib_s": 10.0}, {}),
    "input_pipeline": (
        {"utilization_pct": 45.0},
        {"run_cpu": ((RUN_PID, 30.0), (101, 99.0), (102, 98.0))},
        {},
    ),
    "host_cpu": ({}, {"cpu_pct": 100.0, "run_on_cpu_pct": 40.0}, {}),
}  # fmt: skip
#: the words each names the cause with: the figures that show it
WORDS = {
    "phase": "checkpoint phase: the runner reported its checkpoint phase for 6 s of the 11 s "
    "around the drop",
    "power_cap": "power cap: 700 W limit, GPU at 700 W, SM clock 1410 of 1980 MHz (was 1980)",
    "other_run": "another gpustation run (20260101-000000-b-1a2b): run 20260101-000000-b-1a2b "
    "shares GPU 0, started 1 s after the slowdown began",
    "process": "another process (pid 4242): pid 4242 (bob, python burn.py) at 45 % of GPU 0's SMs",
    "pcie": "PCIe link below its maximum: Gen3 x16 of Gen5 x16",
    "clocks": "clocks held below maximum: SM clock 1410 of 1980 MHz (was 1980), no throttle "
    "reason given",
    "memory_temperature": "memory temperature near its maximum: memory at 93 °C of 95 °C "
    "(was 62 °C)",
    "swap": "swapping: 40.0 MiB/s in, 10.0 MiB/s out (was 0.0 MiB/s)",
    "input_pipeline": "input pipeline starving the GPU: GPU utilisation 97 → 45 %, its loader "
    "processes at 99, 98 % CPU (pid 101, 102)",
    "host_cpu": "host CPU saturated: 100 % of 16 cores busy (was 40 %), the run's processes "
    "on a CPU 40 % of their ready time (was 95 %)",
}
#: the order they are tried in
ORDER = list(CAUSES)


def injected(*kinds: str) -> Clues:
    """The evidence of every cause in ``kinds``; the first one's changes win a clash."""
    gpu: dict[str, Any] = {}
    host: dict[str, Any] = {}
    more: dict[str, Any] = {}
    for kind in reversed(kinds):
        g, h, m = CAUSES[kind]
        gpu.update(g)
        host.update(h)
        more.update(m)
    return clues(gpu, host, **more)


@pytest.mark.parametrize("kind", ORDER)
def test_each_cause_is_named_with_its_figures(kind: str) -> None:
    cause = name_cause(injected(kind))
    assert cause.kind == kind, cause.words
    assert cause.words == WORDS[kind]


@pytest.mark.parametrize(("first", "second"), list(itertools.pairwise(ORDER)), ids=lambda k: str(k))
def test_causes_are_tried_in_order(first: str, second: str) -> None:
    assert name_cause(injected(first, second)).kind == first
    assert name_cause(injected(second, first)).kind == first


def test_a_phase_names_the_drop_only_when_it_took_a_real_part_of_it() -> None:
    changes = [(T0, "train"), (T0 + 10, "eval"), (T0 + 10.5, "train"), (T0 + 30, "save")]
    # A half-second eval in the 11 s around a drop explains nothing ...
    spent = phase_seconds(changes, T0 + 5, T0 + 16)
    assert dict(spent) == pytest.approx({"train": 10.5, "eval": 0.5})
    assert name_cause(clues(phases=spent, phase_window_s=11.0)).kind == "unknown"
    # ... a save that goes on through it does.
    spent = phase_seconds(changes, T0 + 27, T0 + 38)
    assert dict(spent) == pytest.approx({"train": 3.0, "save": 8.0})
    assert name_cause(clues(phases=spent, phase_window_s=11.0)).kind == "phase"
    # Before the runner's first phase report it was in none.
    assert phase_seconds(changes, T0 - 10, T0 + 1) == (("train", 1.0),)


def test_a_cap_that_explains_little_of_the_drop_gives_way_to_what_does() -> None:
    # A matmul beside the run pushed the card to its power limit: clocks 7 % down,
    # the run at half speed. The process explains it; the cap does not.
    capped = {"throttle": ("sw_power_cap",), "power_w": 700.0, "clock_sm_mhz": 1850.0}
    both = clues({**capped, "processes": (RUN_PROCESS, BURNER)}, lost_pct=50.0)
    assert name_cause(both).kind == "process"
    # With nothing else to name, the cap is still what was seen.
    alone = name_cause(clues(capped, lost_pct=50.0))
    assert alone.kind == "power_cap" and "SM clock 1850 of 1980 MHz (was 1980)" in alone.words
    # A cap that took the clocks down as far as the throughput comes first.
    deep = clues({**capped, "clock_sm_mhz": 1000.0, "processes": (RUN_PROCESS, BURNER)},
                 lost_pct=50.0)  # fmt: skip
    assert name_cause(deep).kind == "power_cap"


def test_the_figures_are_kept_as_numbers_too() -> None:
    cause = name_cause(injected("process")).to_dict()
    assert cause["evidence"] == {
        "gpu": 0,
        "pid": 4242,
        "user": "bob",
        "command": "python burn.py",
        "sm_pct": 45.0,
        "sm_pct_before": 0.0,
    }
    assert name_cause(injected("power_cap")).evidence["power_limit_w"] == 700.0


@pytest.mark.parametrize(
    "reason", ["sw_thermal", "hw_thermal", "hw_slowdown", "hw_power_brake"], ids=str
)
def test_every_limiting_reason_names_its_kind(reason: str) -> None:
    cause = name_cause(clues({"throttle": (reason,), "temperature_c": 88.0}))
    kind = {"hw_slowdown": "hw_slowdown", "hw_power_brake": "power_cap"}.get(reason, "thermal")
    assert cause.kind == kind
    if kind == "thermal":
        assert "GPU at 88 °C (slows down at 89 °C)" in cause.words


def test_a_process_is_named_by_the_shares_read_so_far() -> None:
    # NVML reads the SM shares on slow passes only: a process new since the last one
    # is listed without a share until the next.
    base = injected("process")
    unread = replace(BURNER, sm_pct=None)
    during = [
        replace(m, gpus=(replace(m.gpus[0], processes=(RUN_PROCESS, unread)),)) if i < 4 else m
        for i, m in enumerate(base.during)
    ]
    cause = name_cause(replace(base, during=during))
    assert cause.kind == "process" and "pid 4242" in cause.words
    assert cause.evidence["sm_pct"] == 45.0


def test_a_run_that_loads_its_own_data_is_starved_by_itself() -> None:
    cause = name_cause(clues({"utilization_pct": 40.0}, {"run_cpu": ((RUN_PID, 99.0),)}))
    assert cause.kind == "input_pipeline"
    assert "the run's own process, with no loader processes, at 99 % CPU" in cause.words
    # Loaders with CPU to spare are not starving anything.
    idle = name_cause(clues({"utilization_pct": 40.0}, {"run_cpu": ((RUN_PID, 50.0), (7, 40.0))}))
    assert idle.kind == "unknown"


def test_loaders_that_were_replaced_in_the_drop_are_not_its_loaders() -> None:
    # Eight workers wind down as the loader starts again with one (as on an H100 when
    # a DataLoader went from 8 workers to 1): only the one left is the loader.
    base = clues({"utilization_pct": 24.0})
    old = tuple((200 + n, 60.0) for n in range(8))
    during = [
        replace(m, host=replace(m.host, run_cpu=((RUN_PID, 28.0), *(old if i < 2 else ()),
                                                  (300, 100.0))))
        for i, m in enumerate(base.during)
    ]  # fmt: skip
    cause = name_cause(replace(base, during=during))
    assert cause.kind == "input_pipeline"
    assert "its loader process at 100 % CPU (pid 300)" in cause.words


def test_a_loader_started_afresh_at_the_drops_last_moment_is_still_its_loader() -> None:
    # A DataLoader of one worker started again every few seconds (as on an H100): at
    # the last moment the new worker has no figure yet (its first reading is the
    # baseline), so only the run's own process shows there.
    base = clues({"utilization_pct": 4.0})
    n = len(base.during)
    worker = ((300, 99.0),)
    during = [
        replace(m, host=replace(m.host, run_cpu=((RUN_PID, 19.0),) + (worker if i < n - 1 else ())))
        for i, m in enumerate(base.during)
    ]  # fmt: skip
    cause = name_cause(replace(base, during=during))
    assert cause.kind == "input_pipeline"
    assert "its loader process at 99 % CPU (pid 300)" in cause.words
    # With no worker at all the run's own process is judged, as before.
    alone = [replace(m, host=replace(m.host, run_cpu=((RUN_PID, 19.0),))) for m in base.during]
    assert name_cause(replace(base, during=alone)).kind == "unknown"


def test_a_gpu_little_used_before_is_starved_when_its_utilisation_halves() -> None:
    # ResNet-50 fed by 8 workers, then 1: utilisation 21 → 10 % (H200), 34 → 21 % (H100).
    def starved(before: float, now: float) -> str:
        base = clues({"utilization_pct": now}, {"run_cpu": ((RUN_PID, 20.0), (300, 100.0))})
        was = [replace(m, gpus=(replace(healthy_gpu(), utilization_pct=before),))
               for m in base.before]  # fmt: skip
        return name_cause(replace(base, before=was)).kind

    assert starved(21.2, 10.2) == "input_pipeline"
    assert starved(34.1, 21.3) == "input_pipeline"  # the same on an H100
    assert starved(32.1, 24.2) == "input_pipeline"
    assert starved(21.2, 18.0) == "unknown"  # 15 % less: not starved by this rule
    assert starved(8.0, 2.0) == "unknown"  # too little to tell from noise
    assert starved(40.0, 24.0) == "input_pipeline"  # 16 points


def test_a_host_busy_before_too_starves_a_run_that_now_waits_for_a_cpu() -> None:
    busy = [replace(m, host=replace(m.host, cpu_pct=95.0, run_on_cpu_pct=33.0))
            for m in clues().before]  # fmt: skip
    starved = clues(host={"cpu_pct": 100.0, "run_on_cpu_pct": 20.0})
    cause = name_cause(replace(starved, before=busy))
    assert cause.kind == "host_cpu"
    assert "on a CPU 20 % of their ready time (was 33 %)" in cause.words
    # Busy before and after, and the run waits no more than it did: no finding. (A run
    # that went from 8 loader workers to 1 uses less CPU by itself, and waits less.)
    fewer = clues(host={"cpu_pct": 100.0, "run_on_cpu_pct": 60.0, "run_cpu": ((RUN_PID, 55.0),)})
    assert name_cause(replace(fewer, before=busy)).kind == "unknown"
    # Where the wait cannot be read (no schedstat), only a host that got busier counts.
    unread = [replace(m, host=replace(m.host, run_on_cpu_pct=None)) for m in busy]
    blind = clues(host={"cpu_pct": 100.0, "run_on_cpu_pct": None})
    assert name_cause(replace(blind, before=unread)).kind == "unknown"
    assert name_cause(clues(host={"cpu_pct": 100.0, "run_on_cpu_pct": None})).kind == "host_cpu"


def test_nothing_explains_it_unknown_with_the_figures_looked_at() -> None:
    cause = name_cause(clues())
    assert cause.kind == "unknown"
    assert cause.words == (
        "unknown: no reading explains it (SM clock 1980 of 1980 MHz, utilisation 97 %, "
        "throttle none; host CPU 40 % (was 40 %))"
    )
    # the figures looked at, kept for whoever looks into it
    assert cause.evidence["gpu0"]["utilization_pct_before"] == 97.0
    assert cause.evidence["run_cpu_pct"] == {str(RUN_PID): 100.0}


def test_what_was_there_before_the_drop_explains_nothing() -> None:
    capped = replace(healthy_gpu(), throttle=("sw_power_cap",))
    base = clues({"throttle": ("sw_power_cap",)})
    always = [replace(m, gpus=(capped,)) for m in base.before]
    assert name_cause(replace(base, before=always)).kind == "unknown"
    # Another process at the same share all along, another run that started long before.
    sharing = replace(healthy_gpu(), processes=(RUN_PROCESS, BURNER))
    base = clues({"processes": (RUN_PROCESS, BURNER)})
    assert name_cause(replace(base, before=[replace(m, gpus=(sharing,)) for m in base.before])) \
        .kind == "unknown"  # fmt: skip
    old = OtherRun("old-run", (0,), T0 - 3600.0)
    assert name_cause(clues(other_runs=(old,))).kind == "unknown"
    # ... unless its processes came onto the GPU only in the drop.
    arrived = replace(old, pids=frozenset({555}))
    on_gpu = {"processes": (RUN_PROCESS, ProcessShare(555, 40.0))}
    cause = name_cause(clues(on_gpu, other_runs=(arrived,)))
    assert cause.kind == "other_run" and "old-run" in cause.words


def test_without_the_time_before_or_a_figure_it_is_never_guessed() -> None:
    no_before = replace(injected("power_cap"), before=[])
    assert name_cause(no_before).kind == "unknown"
    # A process the driver gives no SM share for is not named.
    unmeasured = clues({"processes": (RUN_PROCESS, replace(BURNER, sm_pct=None))})
    assert name_cause(unmeasured).kind == "unknown"
    # A run's own other processes are never "another process".
    own = clues(
        {"processes": (RUN_PROCESS, replace(BURNER, pid=101))}, run_pids=frozenset({100, 101})
    )
    assert name_cause(own).kind == "unknown"
    # An idle GPU's lower clocks are its idling, not a cause.
    idle = clues({"clock_sm_mhz": 345.0, "utilization_pct": 5.0}, {"run_cpu": ((RUN_PID, 8.0),)})
    assert name_cause(idle).kind == "unknown"


def test_a_run_on_several_gpus_names_the_gpu() -> None:
    second = replace(healthy_gpu(), index=1)
    capped = replace(second, throttle=("sw_power_cap",), power_w=700.0)
    base = clues(gpus=(0, 1))
    before = [replace(m, gpus=(*m.gpus, second)) for m in base.before]
    during = [replace(m, gpus=(*m.gpus, capped)) for m in base.during]
    cause = name_cause(replace(base, before=before, during=during))
    assert cause.kind == "power_cap" and cause.detail.startswith("GPU 1: 700 W limit")
