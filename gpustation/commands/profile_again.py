"""``gpustation profile apply --again``: what was applied last, applied again
where it drifted (after a reboot or a driver reload), journalled like any apply."""

from __future__ import annotations

import argparse

from gpustation.commands.fan import report_fan_restores
from gpustation.commands.options import command_text, gpus_suffix, open_gpus, simulated_banner
from gpustation.commands.power import print_planned
from gpustation.control.drift import applied_now, find_drift
from gpustation.control.fans import set_fans_auto
from gpustation.control.power import NOT_PERSISTENT, PowerChange, apply_power, power_range
from gpustation.errors import UsageError
from gpustation.telemetry.model import GpuSample
from gpustation.textsafe import safe


def _change(sample: GpuSample, watts: float) -> PowerChange:
    lo, hi = power_range(sample)
    if not lo <= watts <= hi:
        raise UsageError(
            f"GPU {sample.index}: the journalled {watts:g} W is outside the card's range "
            f"{lo:g}-{hi:g} W now (another card in its place?). Nothing was changed; set a "
            "limit with `gpustation power set`."
        )
    return PowerChange(
        gpu=sample.index,
        uuid=sample.uuid,
        name=sample.name,
        current_w=sample.power_limit_w,
        new_w=watts,
        default_w=sample.power_default_w,
        min_w=lo,
        max_w=hi,
    )


def apply_again(args: argparse.Namespace) -> int:
    command = command_text("profile apply --again", gpus_suffix(args))
    with open_gpus(args) as (backend, indices):
        samples = backend.read_gpus(indices, slow=False)
        drifted = find_drift(samples, applied_now(backend.simulated))
        by_index = {s.index: s for s in samples}
        # Every change is checked before any is made.
        changes = [_change(by_index[i], d.power_w) for i, d in sorted(drifted.items()) if d.power_w]
        to_auto = sorted(i for i, d in drifted.items() if d.fans_taken)
        simulated_banner(backend)
        if not drifted:
            print("Nothing drifted: every card has what the control journal says was applied.")
            return 0
        for index, drift in sorted(drifted.items()):
            print(safe(f"GPU {index}: {drift.text()}"))
        if args.dry_run:
            print("Dry run: nothing is changed.")
            print_planned(changes)
            for index in to_auto:
                print(f"would return GPU {index}'s fans to automatic control")
            return 0
        rc = 0
        if to_auto:
            rc = report_fan_restores(
                set_fans_auto(backend, to_auto, command, require_fans=False), detail=False
            )
        for change in apply_power(backend, changes, command):
            print(f"set {change.describe()}", flush=True)
        if changes:
            print(NOT_PERSISTENT)
        for index, drift in sorted(drifted.items()):
            if drift.fans_left:
                # A curve runs in the foreground: it is started by its own command.
                print(
                    safe(
                        f"GPU {index}: its fans ran under `{drift.fan_command}`; run it again "
                        "to put them back under that curve"
                    )
                )
        return rc
