"""Simulated GPUs: a small physical model behind the same Backend interface.

Load (from a deterministic, seeded schedule of synthetic jobs) drives power up
to the enforced limit; temperature follows power and fan speed with a thermal
time constant; clocks drop and throttle reasons appear at the power limit or
near the slowdown temperature. The state (power limits, fan settings,
temperatures, energy) lives in a JSON file in the state directory, guarded by
a lock, so separate processes — the dashboard, ``gpustation power set``, a
fan controller — see the same virtual cards. Every output built from this
backend is marked SIMULATED. The cards and the jobs they run are data, in
:mod:`gpustation.telemetry.sim_cards`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from gpustation import private
from gpustation.errors import UsageError
from gpustation.files import read_text
from gpustation.paths import state_dir, writable
from gpustation.telemetry.backend import Backend, OpenRequest
from gpustation.telemetry.model import (
    IDENTITY,
    GpuLink,
    GpuPlacement,
    GpuSample,
    MigInfo,
    NamedVersion,
    NvLinkInfo,
    ProcessInfo,
    Topology,
    XidEvent,
    field_keys,
    put_field,
    xid_meaning,
)
from gpustation.telemetry.sim_cards import (
    CARDS,
    DEFAULT_CARD,
    DEFAULT_COUNT,
    IDLE_HOLDER,
    IDLE_HOLDER_PID,
    JOB_NAMES,
    CardSpec,
    card_label,
)
from gpustation.telemetry.sim_control import SimControl, gpu_state
from gpustation.telemetry.sim_last import kept_note, last_machine, remember_machine
from gpustation.telemetry.sim_reads import READS, SimView
from gpustation.telemetry.sim_state import gpu_state_ok, new_gpu_state, serials_ok

THERMAL_TAU_S = 20.0
JOB_SLOT_S = 45.0  # the synthetic job schedule changes every this many seconds
MAX_CATCH_UP_S = 900.0  # after a long gap the model is at steady state anyway

IDENTITY_KEYS = tuple(k for k, spec in field_keys().items() if spec.cost == IDENTITY)
_TABLE_READS = {k: read for k, read in READS.items() if read is not None}
_IDENTITY_READS = {k: _TABLE_READS[k] for k in IDENTITY_KEYS}


def _fan_auto_pct(spec: CardSpec, temp_c: float) -> float:
    """The card's own fan curve when fans are on automatic control."""
    pct = 30.0 + (temp_c - 40.0) * 1.6
    return max(float(spec.fan_min_pct), min(float(spec.fan_max_pct), pct))


def machine_path(card: str, count: int) -> Path:
    """The state file of one simulated machine."""

    return state_dir() / f"sim-{card}-{count}.json"


def seed_from_env() -> int:
    """``GPUSTATION_SIM_SEED`` (default 0); UsageError when it is not a whole number."""
    raw = os.environ.get("GPUSTATION_SIM_SEED", "").strip()
    if not raw:
        return 0
    try:
        return int(raw)
    except ValueError:
        raise UsageError(f"GPUSTATION_SIM_SEED={raw!r}: a whole number, or unset it") from None


class SimBackend(Backend):
    """N simulated GPUs of one card model, state shared through a file."""

    simulated = True

    def __init__(
        self,
        count: int = DEFAULT_COUNT,
        card: str = DEFAULT_CARD,
        seed: int = 0,
        state_path: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if card not in CARDS:
            raise UsageError(f"--sim-card: unknown card {card!r} (choose from {', '.join(CARDS)})")
        if not 1 <= count <= 16:
            raise UsageError(f"--simulate: between 1 and 16 GPUs, got {count}")
        self.spec = CARDS[card]
        self.count = count
        self.seed = seed
        self.state_path = state_path
        self.clock = clock
        self._memory_state: dict[str, Any] | None = None
        self._last_slow: dict[int, tuple[float, float, int]] = {}
        #: the card in each slot when the machine was re-ordered (None: in order)
        self._order: list[int] | None = None
        self.control = SimControl(self.spec, self._changing)
        with self._state() as state:
            if (
                state.get("card") != card
                or state.get("count") != count
                or state.get("seed") != seed
                or len(state.get("gpus", [])) != count
            ):
                state.clear()
                state.update(self._fresh_state())

    # ---- construction ----------------------------------------------------
    @classmethod
    def open(
        cls, count: int | None = None, card: str | None = None, seed: int | None = None
    ) -> SimBackend:
        """Open a simulated machine, its state kept in the state directory.

        Each machine (card and count) has a file of its own, so a snapshot of
        simulated H200s never disturbs a dashboard of simulated RTX 4090s.
        With no count or card given, the machine last opened is used again, so
        that ``gpustation power set`` acts on the cards the dashboard shows.
        """

        last_count, last_card = last_machine()
        count_kept = count is None and last_count is not None
        card_kept = card is None and last_card is not None
        if count is None:
            count = last_count or DEFAULT_COUNT
        if card is None:
            card = last_card or DEFAULT_CARD
        if seed is None:
            seed = seed_from_env()
        # a read-only state directory (a reader under ProtectHome=read-only) keeps it in memory
        stored = writable(state_dir())
        path = machine_path(card, count) if stored else None
        backend = cls(count=count, card=card, seed=seed, state_path=path)
        if not stored:
            backend.note = f"{state_dir()} is read-only: the simulated GPUs' state is not kept"
        backend.kept = kept_note(count, card, card_label(card), count_kept, card_kept)
        remember_machine(count, card)
        return backend

    def _valid(self, state: Any) -> bool:
        """A state file of the right shape (anything else is started afresh)."""
        if not isinstance(state, dict):
            return False
        gpus = state.get("gpus")
        return (
            isinstance(gpus, list)
            and len(gpus) == self.count
            and all(gpu_state_ok(g, self.spec) for g in gpus)
            and isinstance(state.get("updated"), (int, float))
        )

    def _fresh_state(self) -> dict[str, Any]:
        return {
            "card": self.spec.key,
            "count": self.count,
            "seed": self.seed,
            # start warm: as if the cards had been running for a while
            "updated": self.clock() - MAX_CATCH_UP_S,
            "gpus": [new_gpu_state(self.spec) for _ in range(self.count)],
        }

    @contextlib.contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        """Lock, load, let the caller change, save."""
        if self.state_path is None:
            if self._memory_state is None:
                self._memory_state = {}
            yield self._memory_state
            return
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.state_path.with_suffix(".lock")
        with open(lock_path, "a", opener=private.opener) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                try:
                    # A FIFO or /dev/zero put there is refused, not waited on or read forever.
                    state = json.loads(read_text(self.state_path, "simulator state"))
                except (UsageError, ValueError, RecursionError):
                    state = {}
                if not self._valid(state):
                    state = self._fresh_state()  # damaged or of another shape: start afresh
                yield state
                tmp = self.state_path.with_suffix(".tmp")
                tmp.unlink(missing_ok=True)  # whatever was there (a FIFO would block the write)
                private.write_text(tmp, json.dumps(state))
                os.replace(tmp, self.state_path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # ---- the model -------------------------------------------------------
    def _hash(self, *parts: object) -> float:
        """A deterministic number in [0, 1) from the seed and the parts."""
        digest = hashlib.blake2b(repr((self.seed, *parts)).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64

    def _job(self, index: int, t: float) -> tuple[float, int | None]:
        """Scheduled load (0..1) and the job slot it comes from, at time t."""
        slot = int(t // JOB_SLOT_S)
        r = self._hash("job", index, slot)
        if r < 0.3:
            return 0.0, None
        level = (0.35, 0.7, 0.95, 1.0)[int(self._hash("lvl", index, slot) * 4)]
        # a little ripple so graphs look alive, still deterministic
        ripple = 0.04 * math.sin(t / 3.0 + index)
        return max(0.0, min(1.0, level + ripple)), slot

    def _advance(self, state: dict[str, Any], now: float) -> None:
        last = float(state.get("updated", now))
        elapsed = min(max(0.0, now - last), MAX_CATCH_UP_S)
        t = now - elapsed
        step = 1.0
        while True:
            dt = min(step, now - t)
            for i, g in enumerate(state["gpus"]):
                self._step_gpu(i, g, t + dt, dt)
            t += dt
            if now - t <= 1e-9:
                break
        state["updated"] = now

    def _step_gpu(self, index: int, g: dict[str, Any], t: float, dt: float) -> None:
        spec = self.spec
        if g["lost"]:
            return
        load = g["load"] if g["load"] is not None else self._job(index, t)[0]
        g["load_now"] = load
        demand = spec.power_idle_w + load * (spec.power_demand_w - spec.power_idle_w)
        limit = float(g["power_limit_w"])
        reasons: list[str] = []
        power = min(demand, limit)
        if demand > limit + 0.5:
            reasons.append("sw_power_cap")
        temp = float(g["temperature_c"])
        near = spec.slowdown_c - 2.0
        thermal = 1.0
        if temp >= near:
            reasons.append("sw_thermal")
            # clocks back off steeply as the slowdown temperature nears
            thermal = max(0.55, 1.0 - 0.12 * (temp - near + 1.0))
            power = min(power, spec.power_idle_w + (power - spec.power_idle_w) * thermal)
        if temp >= spec.slowdown_c:
            reasons.append("hw_thermal")
        if load < 0.05:
            reasons.append("gpu_idle")
        # fans
        fans: list[float] = []
        for f in range(spec.fans):
            if g["fan_mode"][f] == "manual":
                fans.append(float(g["fan_manual_pct"][f]))
            else:
                fans.append(_fan_auto_pct(spec, temp))
        fan_avg = sum(fans) / len(fans) if fans else 0.0
        r = spec.thermal_r / (1.0 + 1.1 * fan_avg / 100.0) if spec.fans else spec.thermal_r
        target = float(g["ambient_c"]) + power * r
        temp += (target - temp) * (1.0 - math.exp(-dt / THERMAL_TAU_S))
        g["temperature_c"] = temp
        g["power_w"] = power
        g["fans_pct"] = fans
        g["energy_j"] = float(g["energy_j"]) + power * dt
        g["throttle"] = reasons
        if load < 0.05:
            g["clock_sm_mhz"] = spec.clock_sm_idle_mhz
        else:
            cap = min(1.0, (limit / demand) ** 0.5) if demand > 0 else 1.0
            g["clock_sm_mhz"] = spec.clock_sm_max_mhz * cap * thermal

    # ---- Backend: reading ------------------------------------------------
    def device_count(self) -> int:
        return self.count

    def driver_version(self) -> str | None:
        return "simulated"

    def library_version(self) -> NamedVersion | None:
        return NamedVersion("NVML", "simulated")

    def read_gpus(self, indices: Sequence[int], slow: bool) -> list[GpuSample]:
        now = self.clock()
        with self._state() as state:
            self._advance(state, now)
            gpus = [dict(state["gpus"][i]) for i in indices]
            serials = state.get("serials")
        self._order = serials if serials_ok(serials, self.count) else None
        return [self._sample(i, g, now, slow) for i, g in zip(indices, gpus, strict=True)]

    def _serials(self, index: int) -> int:
        return self._order[index] if self._order is not None else index

    def reorder(self, order: Sequence[int]) -> None:
        """Move the cards between slots, as a re-cabled or re-enumerated machine does:
        index ``i`` becomes the card that was at ``order[i]``, its UUID and state
        (power limit, fans) with it."""
        if sorted(order) != list(range(self.count)):
            raise ValueError(f"order: a permutation of 0-{self.count - 1}, got {list(order)}")
        with self._state() as state:
            self._advance(state, self.clock())
            was = list(state.get("serials") or range(self.count))
            state["gpus"] = [state["gpus"][i] for i in order]
            state["serials"] = [was[i] for i in order]
        self._order = None if state["serials"] == list(range(self.count)) else state["serials"]

    def _sample(self, index: int, g: dict[str, Any], now: float, slow: bool) -> GpuSample:
        spec = self.spec
        # A card keeps its UUID wherever it sits (see :meth:`reorder`), and
        # another simulated card model never shares it.
        view = SimView(index, self._serials(index), spec, g, self._hash)
        sample = GpuSample(index=index)
        if g["lost"]:
            for key in IDENTITY_KEYS:
                put_field(sample, key, _IDENTITY_READS[key](view))
            sample.lost = True
            return sample
        view.load = load = float(g["load_now"])
        _, slot = self._job(index, now) if g["load"] is None else (0.0, None)
        procs = view.processes
        # NVML's v2 "used" leaves the driver's reservation out: an idle card reads
        # 0 and a busy one what its processes hold, unless memory was orphaned.
        mem_used = float(g["orphaned_mib"])
        if view.busy:
            jobs = [slot] if slot is not None else [0]
            for j in jobs:
                name, command = JOB_NAMES[int(self._hash("name", index, j) * len(JOB_NAMES))]
                mem = round(spec.memory_total_mib * (0.25 + 0.6 * self._hash("mem", index, j)))
                procs.append(
                    ProcessInfo(
                        pid=20000 + int(self._hash("pid", index, j) * 30000),
                        gpu_memory_mib=float(mem),
                        user="sim",
                        name=name,
                        command=command,
                    )
                )
                mem_used += mem
        holder_mib = g.get("idle_holder_mib")
        if holder_mib is not None:
            name, command = IDLE_HOLDER
            procs.append(
                ProcessInfo(
                    pid=IDLE_HOLDER_PID + index,
                    gpu_memory_mib=float(holder_mib),
                    user="sim",
                    name=name,
                    command=command,
                )
            )
            mem_used += float(holder_mib)
        for pid, sm, mib in g.get("guests", ()):
            # a real process of this host put on the card: the sampler names it
            procs.append(ProcessInfo(pid=int(pid), gpu_memory_mib=float(mib), sm_pct=float(sm)))
            mem_used += float(mib)
        view.memory_used_mib = mem_used
        if slow or index not in self._last_slow:
            tx = round(load * 1_800_000 * (0.8 + 0.4 * self._hash("tx", index, int(now))))
            rx = round(load * 2_400_000 * (0.8 + 0.4 * self._hash("rx", index, int(now))))
            self._last_slow[index] = (float(tx), float(rx), 0)
        view.pcie_slow = self._last_slow[index]
        view.read_energy, view.read_ecc = self.read_energy, self.read_ecc
        for key, read in _TABLE_READS.items():
            put_field(sample, key, read(view))
        self._deep(index, g, sample, load, now)
        return sample

    def _deep(
        self, index: int, g: dict[str, Any], sample: GpuSample, load: float, now: float
    ) -> None:
        """GPM, per-process SM, XIDs, NVLink, MIG and remapped rows, as the card has them."""
        spec = self.spec
        busy = load >= 0.05
        # Tensor-heavy jobs (bf16 training, LLMs) keep the tensor cores busy;
        # some jobs (fp32, data loading) hardly touch them.
        tensor_share = 0.35 + 0.6 * self._hash("tensor", index, int(now // JOB_SLOT_S))
        if spec.gpm and self.read_gpm:
            sample.sm_active_pct = round(min(100.0, load * 94.0), 1) if busy else 0.0
            sample.sm_occupancy_pct = round(load * 16.0, 1) if busy else 0.0
            sample.tensor_active_pct = round(load * 92.0 * tensor_share, 1) if busy else 0.0
            sample.dram_active_pct = round(load * 18.0 + (2.0 if busy else 0.0), 1) if busy else 0.0
        util = sample.utilization_gpu_pct or 0.0
        # The scheduled job uses most of the SMs' time; guests keep the share poked in.
        for n, proc in enumerate(p for p in sample.processes if p.sm_pct is None):
            proc.sm_pct = round(util * 0.8) if n == 0 else 0.0
        sample.xid_events = [
            XidEvent(time=float(t), code=int(c), meaning=xid_meaning(int(c))) for t, c in g["xid"]
        ][-16:]
        if spec.nvlinks:
            per_link = load * 9_000_000.0 / spec.nvlinks if busy else 0.0  # KiB/s
            sample.nvlink = [
                NvLinkInfo(
                    link=link,
                    active=True,
                    tx_kib_s=round(per_link * (0.9 + 0.2 * self._hash("nvtx", index, link))),
                    rx_kib_s=round(per_link * (0.9 + 0.2 * self._hash("nvrx", index, link))),
                    replay_errors=0,
                    recovery_errors=0,
                    crc_errors=0,
                )
                for link in range(spec.nvlinks)
            ]
        else:
            sample.nvlink = []
        sample.mig = MigInfo(enabled=False, pending=False) if spec.mig else None

    def topology(self, indices: Sequence[int]) -> Topology:
        topo = Topology()
        half = max(1, self.count // 2)
        for i in indices:
            numa = 0 if i < half else 1
            topo.gpus.append(
                GpuPlacement(
                    index=i,
                    numa_node=numa,
                    cpu_affinity="0-15" if numa == 0 else "16-31",
                )
            )
        for a in indices:
            for b in indices:
                if b <= a:
                    continue
                if self.spec.nvlinks:
                    level, links = f"NV{self.spec.nvlinks}", self.spec.nvlinks
                elif (a < half) == (b < half):
                    level, links = ("PIX" if abs(a - b) == 1 else "PXB"), 0
                else:
                    level, links = "SYS", 0
                p2p = level != "SYS"
                topo.links.append(GpuLink(a, b, level, p2p, p2p, links))
        return topo

    # ---- control ------------------------------------------------------------
    def _gpu_state(self, state: dict[str, Any], index: int) -> dict[str, Any]:
        return gpu_state(state["gpus"], index)

    @contextlib.contextmanager
    def _changing(self) -> Iterator[list[dict[str, Any]]]:
        """The cards' states, brought up to now, to change under the state lock."""
        with self._state() as state:
            self._advance(state, self.clock())
            yield state["gpus"]

    # ---- simulation knobs (tests, demos) -------------------------------------
    def poke(self, index: int, **values: Any) -> None:
        """Change the simulated world: ``load`` (0..1 or None for the schedule),
        ``ambient_c``, ``lost``, ``ecc_uncorrected``, ``temperature_c``,
        ``temperature_fails`` (temperature reads return nothing), ``xid`` (an
        XID code the card reports now), ``idle_holder_mib`` (a process holding
        that much memory whatever the load, None to end it), ``orphaned_mib``
        (VRAM used that no listed process holds), ``holders`` ((pid, command)
        of each process holding the device node open without being listed),
        ``guests`` ((pid, SM %, MiB) of each real process of this host listed
        on the card beside the schedule's job, with its share of the SMs),
        ``pcie_gen`` and ``pcie_width`` (the link trained down to that gen or
        width, None for the card's own)."""
        xid = values.pop("xid", None)
        if "holders" in values:
            values["holders"] = [[int(pid), str(cmd)] for pid, cmd in values["holders"]]
        if "guests" in values:
            values["guests"] = [[int(p), float(sm), float(mib)] for p, sm, mib in values["guests"]]
        for key in ("pcie_gen", "pcie_width"):
            if values.get(key) is not None:
                values[key] = int(values[key])
        if "orphaned_mib" in values:
            values["orphaned_mib"] = float(values["orphaned_mib"])
        allowed = {
            "load",
            "ambient_c",
            "lost",
            "ecc_uncorrected",
            "temperature_c",
            "temperature_fails",
            "idle_holder_mib",
            "orphaned_mib",
            "holders",
            "guests",
            "pcie_gen",
            "pcie_width",
        }
        unknown = set(values) - allowed
        if unknown:
            raise ValueError(f"unknown simulation knob(s): {', '.join(sorted(unknown))}")
        holder = values.get("idle_holder_mib")
        if holder is not None and (
            isinstance(holder, bool) or not isinstance(holder, (int, float)) or not holder >= 0
        ):
            raise ValueError(f"idle_holder_mib: MiB of 0 or more, or None; got {holder!r}")
        with self._state() as state:
            now = self.clock()
            self._advance(state, now)
            g = self._gpu_state(state, index)
            before = dict(g)
            g.update(values)
            if not gpu_state_ok(g, self.spec):
                g.clear()
                g.update(before)
                raise ValueError(f"simulation knob(s) out of range: {values!r}")
            if xid is not None:
                g["xid"] = [*g["xid"], [now, int(xid)]][-16:]


def open_request(request: OpenRequest) -> Backend:
    """The registry's way in (``telemetry/registry.py``)."""
    simulate = request.simulate
    count = None if simulate is None or simulate < 0 else simulate
    return SimBackend.open(count=count, card=request.sim_card)
