"""Alert rules over consecutive snapshots: pure functions, no UI.

:func:`conditions` says which alert conditions hold in one snapshot;
:func:`evaluate` compares two consecutive snapshots and returns only the
alerts that have just started (a condition that holds on every tick is raised
once, when it appears). :class:`AlertLog` keeps the log and the set of
active alerts that a status line shows. :func:`topology_findings` puts the
topology's weak spots into words.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpustation.config import config_path, section
from gpustation.errors import GpustationError, UsageError
from gpustation.telemetry import health
from gpustation.telemetry.format import pcie_link
from gpustation.telemetry.model import GpuSample, Snapshot

#: a condition that clears and comes back within this time is not logged again
REPEAT_QUIET_S = 60.0

RULES: dict[str, str] = {
    "temp_near_slowdown": "temperature near slowdown",
    "memory_temp_near_max": "memory temperature near its maximum",
    "thermal_throttle": "thermal throttling",
    "power_cap": "power-cap throttling",
    "pcie_below_max": "PCIe link below maximum under load",
    "vram_high": "VRAM almost full",
    "ecc_uncorrected": "new uncorrected ECC error",
    "gpu_lost": "GPU lost",
    "gpu_idle_held": "GPU memory held while the GPU is idle",
    "xid": "new XID error from the driver",
    "row_remap_pending": "memory row remap pending: reset the GPU",
    "row_remap_failure": "memory row remap failed: the card needs service",
    "limit_drifted": "power limit or fans no longer what was applied",
}
CRITICAL = frozenset(
    {"gpu_lost", "ecc_uncorrected", "thermal_throttle", "xid", "row_remap_failure"}
)


@dataclass(frozen=True, slots=True)
class Alert:
    rule: str  # a key of RULES
    gpu: int
    message: str
    time: float
    #: the log's record that a condition stopped holding (not an alert of its own)
    cleared: bool = False
    #: a fact about a card said once in the log (not an alert, never notified)
    note: bool = False

    @property
    def key(self) -> tuple[str, int]:
        return (self.rule, self.gpu)

    @property
    def severity(self) -> str:
        if self.cleared:
            return "cleared"
        if self.note:
            return "note"
        return "critical" if self.rule in CRITICAL else "warning"

    @property
    def short(self) -> str:
        """A few words for a status line: ``GPU0 power cap``."""
        words = {
            "temp_near_slowdown": "hot",
            "memory_temp_near_max": "memory hot",
            "thermal_throttle": "thermal throttle",
            "power_cap": "power cap",
            "pcie_below_max": "PCIe slow",
            "vram_high": "VRAM full",
            "ecc_uncorrected": "ECC error",
            "gpu_lost": "LOST",
            "gpu_idle_held": "held idle",
            "xid": "XID",
            "row_remap_pending": "remap pending",
            "row_remap_failure": "remap failed",
            "limit_left": "limit left",
            "limit_drifted": "limit drifted",
        }
        return f"GPU{self.gpu} {words.get(self.rule, self.rule)}"


def _gpu_conditions(gpu: GpuSample, t: float) -> list[Alert]:
    i = gpu.index
    if gpu.lost:
        return [Alert("gpu_lost", i, f"GPU {i} is lost: the driver no longer answers for it", t)]
    out: list[Alert] = []
    margin = gpu.slowdown_margin_c
    if margin is not None and health.near_slowdown(gpu):
        out.append(
            Alert(
                "temp_near_slowdown",
                i,
                f"GPU {i} at {gpu.temperature_c:.0f} C, {max(margin, 0):.0f} C from its "
                f"slowdown temperature {gpu.temperature_slowdown_c:.0f} C",
                t,
            )
        )
    mem_margin = gpu.memory_temperature_margin_c
    if mem_margin is not None and health.memory_near_max(gpu):
        out.append(
            Alert(
                "memory_temp_near_max",
                i,
                f"GPU {i} memory at {gpu.memory_temperature_c:.0f} C, {max(mem_margin, 0):.0f} C "
                f"from its maximum {gpu.memory_temperature_max_c:.0f} C",
                t,
            )
        )
    if gpu.limit_drift:
        out.append(Alert("limit_drifted", i, f"GPU {i}: {gpu.limit_drift}", t))
    if gpu.thermal_throttled:
        out.append(Alert("thermal_throttle", i, f"GPU {i} is slowing its clocks: too hot", t))
    if gpu.power_throttled:
        limit = f" of {gpu.power_limit_w:.0f} W" if gpu.power_limit_w else ""
        out.append(Alert("power_cap", i, f"GPU {i} is held back by its power limit{limit}", t))
    util = gpu.utilization_gpu_pct
    if util is not None and health.slow_link_under_load(gpu):
        p = gpu.pcie
        out.append(
            Alert(
                "pcie_below_max",
                i,
                f"GPU {i} PCIe link runs at {pcie_link(p.gen, p.width)}, below its maximum "
                f"{pcie_link(p.max_gen, p.max_width)}, while {util:.0f} % busy",
                t,
            )
        )
    pct = gpu.memory_pct
    if pct is not None and health.vram_full(gpu):
        out.append(Alert("vram_high", i, f"GPU {i} VRAM {pct:.0f} % used", t))
    rows = gpu.remapped_rows
    if rows.pending:
        out.append(
            Alert(
                "row_remap_pending",
                i,
                f"GPU {i} has a memory row remap pending: reset the GPU (when idle) to apply it",
                t,
            )
        )
    if rows.failure:
        out.append(
            Alert(
                "row_remap_failure",
                i,
                f"GPU {i} failed to remap a memory row (no spare left): the card needs service",
                t,
            )
        )
    return out


def _new_xids(old: GpuSample | None, gpu: GpuSample) -> list[Alert]:
    """An alert for each XID in ``gpu`` that ``old`` (the GPU's previous sample) had not."""
    if gpu.lost or not gpu.xid_events:
        return []
    before = (old.xid_events or []) if old is not None else []
    seen = max((e.time for e in before), default=None)
    out = []
    for event in gpu.xid_events:
        if seen is not None and event.time <= seen:
            continue
        meaning = f": {event.meaning}" if event.meaning else ""
        out.append(
            Alert(
                "xid", gpu.index, f"GPU {gpu.index} reported XID {event.code}{meaning}", event.time
            )
        )
    return out


def conditions(snapshot: Snapshot) -> list[Alert]:
    """Every alert condition that holds in ``snapshot`` (ECC needs two; see evaluate)."""
    out: list[Alert] = []
    for gpu in snapshot.gpus:
        out.extend(_gpu_conditions(gpu, snapshot.time))
    return out


def evaluate(prev: Snapshot | None, cur: Snapshot) -> list[Alert]:
    """The alerts that start with ``cur``: conditions that did not hold in ``prev``.

    Also: a GPU in ``prev`` missing from ``cur`` is lost, an uncorrected ECC
    count that went up is a new error, and each XID that ``prev`` did not have
    is one alert. With ``prev=None`` every condition that holds is new, and so
    is every XID (they were received while watching); the ECC rule needs a
    previous count and stays quiet.
    """
    return _evaluate(prev, cur, conditions(prev) if prev is not None else [], conditions(cur))


def _evaluate(
    prev: Snapshot | None, cur: Snapshot, prev_conditions: list[Alert], cur_conditions: list[Alert]
) -> list[Alert]:
    before = {a.key for a in prev_conditions}
    new = [a for a in cur_conditions if a.key not in before]
    old_by_index = {g.index: g for g in prev.gpus} if prev is not None else {}
    for now_gpu in cur.gpus:
        new.extend(_new_xids(old_by_index.get(now_gpu.index), now_gpu))
    if prev is None:
        return new
    now_by_index = {g.index: g for g in cur.gpus}
    for old in prev.gpus:
        g = now_by_index.get(old.index)
        if g is None and not old.lost:
            new.append(
                Alert(
                    "gpu_lost", old.index, f"GPU {old.index} disappeared from the driver", cur.time
                )
            )
            continue
        if g is None or g.lost:
            continue
        if (
            g.ecc_uncorrected is not None
            and old.ecc_uncorrected is not None
            and g.ecc_uncorrected > old.ecc_uncorrected
        ):
            n = g.ecc_uncorrected - old.ecc_uncorrected
            new.append(
                Alert(
                    "ecc_uncorrected",
                    g.index,
                    f"GPU {g.index}: {n} new uncorrected ECC error{'s' if n > 1 else ''} "
                    f"({g.ecc_uncorrected} in total): results on this GPU may be wrong",
                    cur.time,
                )
            )
    return new


@dataclass(frozen=True, slots=True)
class IdleRule:
    """A GPU held but idle: a process holds at least ``min_gib`` of its memory
    while its utilisation stays under ``max_util_pct`` for ``minutes``
    (``[alerts] idle_min_gib``, ``idle_max_util_pct``, ``idle_minutes``)."""

    min_gib: float = 1.0
    max_util_pct: float = 5.0
    minutes: float = 10.0


def load_idle_rule(path: Path | None = None) -> IdleRule:
    """``[alerts] idle_min_gib / idle_max_util_pct / idle_minutes`` from config.toml."""

    path = path or config_path()
    table = section("alerts", path)
    default = IdleRule()
    values: dict[str, float] = {}
    problems = []
    for key, attr in (
        ("idle_min_gib", "min_gib"),
        ("idle_max_util_pct", "max_util_pct"),
        ("idle_minutes", "minutes"),
    ):
        value = table.get(key, getattr(default, attr))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            problems.append(f"{key} must be a number of 0 or more")
            continue
        values[attr] = float(value)
    unknown = sorted(set(table) - {"idle_min_gib", "idle_max_util_pct", "idle_minutes"})
    if unknown:
        problems.append(f"unknown key(s): {', '.join(unknown)}")
    if problems:
        raise UsageError(f"{path} [alerts]: " + "; ".join(problems))
    return IdleRule(**values)


def idle_rule_or_default() -> IdleRule:
    """The configured idle rule; a bad ``[alerts]`` table is logged and the defaults used
    (an alert rule must never stop the dashboard or the exporter)."""

    try:
        return load_idle_rule()
    except GpustationError as err:
        logging.getLogger(__name__).warning("%s", err)
        return IdleRule()


def fans_unattended(unattended: dict[int, list[int]], t: float) -> list[Alert]:
    """Conditions for fans left on manual control with no controller (found by the
    control layer, which telemetry does not import)."""
    return [
        Alert(
            "fans_unattended",
            index,
            f"GPU {index} fan {', '.join(map(str, fans))} on manual control with no fan "
            "controller running: they will not follow the temperature "
            "(`gpustation fan auto` hands them back)",
            t,
        )
        for index, fans in unattended.items()
    ]


def limits_left(notes: dict[int, str], t: float) -> list[Alert]:
    """Conditions for power limits a killed program left changed, each with its
    note ("limit left by sweep ID; ..."), found by the control layer."""
    return [Alert("limit_left", index, f"GPU {index}: {note}", t) for index, note in notes.items()]


class IdleHeld:
    """Times how long each GPU process has held memory on an idle GPU."""

    def __init__(self, rule: IdleRule) -> None:
        self.rule = rule
        self._since: dict[tuple[int, int], float] = {}

    def conditions(self, snapshot: Snapshot) -> list[Alert]:
        rule = self.rule
        seen: set[tuple[int, int]] = set()
        out: list[Alert] = []
        for gpu in snapshot.gpus:
            util = gpu.utilization_gpu_pct
            if gpu.lost or util is None or util >= rule.max_util_pct:
                continue
            holders = []
            for proc in gpu.processes:
                mib = proc.gpu_memory_mib
                if mib is None or mib < rule.min_gib * 1024:
                    continue
                key = (gpu.index, proc.pid)
                seen.add(key)
                since = self._since.setdefault(key, snapshot.time)
                if snapshot.time - since >= rule.minutes * 60:
                    holders.append(proc)
            if holders:
                who = "; ".join(
                    f"pid {p.pid} ({p.user or 'unknown user'}: {p.command or p.name or '?'}) "
                    f"holds {(p.gpu_memory_mib or 0) / 1024:.1f} GiB"
                    for p in holders
                )
                out.append(
                    Alert(
                        "gpu_idle_held",
                        gpu.index,
                        f"GPU {gpu.index} idle (under {rule.max_util_pct:g} % for "
                        f"{rule.minutes:g} min) while {who}",
                        snapshot.time,
                    )
                )
        for key in set(self._since) - seen:
            del self._since[key]
        return out


class AlertLog:
    """Feeds snapshots through :func:`evaluate`; keeps the log and active alerts."""

    def __init__(
        self,
        length: int = 500,
        repeat_quiet_s: float = REPEAT_QUIET_S,
        idle: IdleRule | None = None,
    ) -> None:
        self._idle = IdleHeld(idle or IdleRule())
        self.log: deque[Alert] = deque(maxlen=length)
        self.repeat_quiet_s = repeat_quiet_s
        self._prev: Snapshot | None = None
        self._prev_conditions: list[Alert] = []
        self._active: dict[tuple[str, int], Alert] = {}
        self._cleared_at: dict[tuple[str, int], float] = {}
        self._vanished: dict[int, Alert] = {}
        self._ecc_events: dict[int, Alert] = {}
        #: conditions whose start is in the log (their end is logged too)
        self._logged_episodes: set[tuple[str, int]] = set()
        self._xid_events: dict[int, Alert] = {}
        #: facts about the cards, each said once (a sensor a card lacks), apart
        #: from the alerts
        self.notes: list[Alert] = []
        self._noted: set[str] = set()

    def update(self, snapshot: Snapshot, extra: Sequence[Alert] = ()) -> list[Alert]:
        """Take the next snapshot; return the alerts newly written to the log.

        ``extra``: conditions found outside the snapshot (fans left on manual
        control with no controller, which only the control layer can tell).
        """
        # Conditions are computed once per snapshot and kept for the next call.
        cur_conditions = [*conditions(snapshot), *self._idle.conditions(snapshot), *extra]
        raised = _evaluate(self._prev, snapshot, self._prev_conditions, cur_conditions)
        self._prev = snapshot
        self._prev_conditions = cur_conditions
        now = {a.key: a for a in cur_conditions}
        present = {g.index for g in snapshot.gpus}
        for index in list(self._vanished):
            if index in present:
                del self._vanished[index]
        logged: list[Alert] = []
        for alert in raised:
            if alert.rule == "ecc_uncorrected":
                self._ecc_events[alert.gpu] = alert
            elif alert.rule == "xid":
                self._xid_events[alert.gpu] = alert
            elif alert.rule == "gpu_lost" and alert.gpu not in present:
                self._vanished[alert.gpu] = alert
            cleared = self._cleared_at.get(alert.key)
            if cleared is not None and snapshot.time - cleared < self.repeat_quiet_s:
                continue  # flapping around a threshold: keep the log readable
            self._logged_episodes.add(alert.key)
            self.log.append(alert)
            logged.append(alert)
        for key in set(self._active) - set(now):
            self._cleared_at[key] = snapshot.time
            started = self._active[key]
            # a clear is logged when its start was (a quieted flap logs neither)
            if key in self._logged_episodes and started.rule not in ("gpu_lost", "ecc_uncorrected"):
                self._logged_episodes.discard(key)
                self.log.append(
                    Alert(
                        started.rule,
                        started.gpu,
                        f"GPU {started.gpu}: {RULES.get(started.rule, started.rule)} cleared "
                        f"(after {max(0.0, snapshot.time - started.time):.0f} s)",
                        snapshot.time,
                        cleared=True,
                    )
                )
        # keep the first alert of an ongoing condition (its start time)
        self._active = {k: self._active.get(k, a) for k, a in now.items()}
        self._note_sensors(snapshot)
        return logged

    def _note_sensors(self, snapshot: Snapshot) -> None:
        """Say once per card that it has no memory temperature sensor (GDDR), so
        the card need not show a gap on every refresh."""
        for gpu in snapshot.gpus:
            key = gpu.uuid or str(gpu.index)
            if gpu.lost or key in self._noted or not memory_temperature_unreported(gpu):
                continue
            self._noted.add(key)
            self.notes.append(
                Alert(
                    "memory_temp_not_reported",
                    gpu.index,
                    f"GPU {gpu.index} ({health.short_name(gpu.name)}): memory temperature "
                    "not reported by this card",
                    snapshot.time,
                    note=True,
                )
            )

    @property
    def active(self) -> list[Alert]:
        """Conditions holding now, plus ECC errors and the last XID of each GPU
        since the dashboard started."""
        out = [
            *self._active.values(),
            *self._vanished.values(),
            *self._ecc_events.values(),
            *self._xid_events.values(),
        ]
        return sorted(out, key=lambda a: (a.severity != "critical", a.gpu, a.rule))


def memory_temperature_unreported(gpu: GpuSample) -> bool:
    """The card has no memory temperature at all (neither a reading nor a
    maximum): GDDR cards, where NVML has no such field."""
    return gpu.memory_temperature_c is None and gpu.memory_temperature_max_c is None


def topology_findings(snapshot: Snapshot) -> list[str]:
    """The topology's weak spots in words: slow PCIe links under load, SYS pairs."""
    out: list[str] = []
    for gpu in snapshot.gpus:
        p = gpu.pcie
        if gpu.lost or not p.below_max:
            continue
        util = gpu.utilization_gpu_pct
        busy = util is not None and util > health.PCIE_BUSY_UTIL_PCT
        state = f"while {util:.0f} % busy" if busy else "(idle: likely power saving)"
        out.append(
            f"GPU {gpu.index} PCIe runs at {pcie_link(p.gen, p.width)}, below its maximum "
            f"{pcie_link(p.max_gen, p.max_width)} {state}."
        )
    sys_pairs = [
        f"GPU {k.gpu_a} and GPU {k.gpu_b}" for k in snapshot.topology.links if k.level == "SYS"
    ]
    if sys_pairs:
        out.append(
            f"{'; '.join(sys_pairs)} only meet across the CPU interconnect (SYS): traffic "
            "between them crosses sockets, so keep a job's GPUs on one NUMA node."
        )
    no_p2p = [
        f"GPU {k.gpu_a} and GPU {k.gpu_b}"
        for k in snapshot.topology.links
        if k.level != "SYS" and (k.p2p_read is False or k.p2p_write is False)
    ]
    if no_p2p:
        out.append(f"{'; '.join(no_p2p)} cannot use peer-to-peer access.")
    return out
