"""``gpustation fan show | run PROFILE | auto``."""

from __future__ import annotations

import argparse
import sys

from gpustation.commands.options import (
    add_control_options,
    add_controller_options,
    add_gpu_options,
    check_interval,
    command_text,
    gpus_suffix,
    open_gpus,
    print_json,
    simulated_banner,
)
from gpustation.control.fancurve import FanController, running_controllers
from gpustation.control.fans import (
    UNATTENDED_HINT,
    FanRestore,
    fan_gpus,
    set_fans_auto,
    unattended_manual_fans,
)
from gpustation.control.profiles import FanCurve, Profile, load_profile
from gpustation.errors import EXIT_FAILURE, NotSupportedError, UsageError
from gpustation.telemetry.backend import Backend


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "fan",
        help="show fans, run a fan curve, or hand the fans back to the card",
        description="Fan control. `fan run PROFILE` drives the fans along the profile's curve "
        "in the foreground until stopped (Ctrl-C, SIGTERM, SIGHUP); on every way out the fans "
        "go back to automatic control.",
    )
    actions = p.add_subparsers(dest="fan_action", metavar="ACTION", required=True)

    show = actions.add_parser("show", help="fan speeds, control mode and accepted range per GPU")
    add_gpu_options(show)
    show.add_argument("--json", action="store_true", help="print JSON")

    run_ = actions.add_parser(
        "run",
        help="run a profile's fan curve in the foreground",
        description="Drive the fans along PROFILE's curve until stopped. A failed temperature "
        "read, or a temperature near the card's slowdown point, sets the fans to maximum until "
        "readings recover. The fans go back to automatic control when it stops.",
    )
    run_.add_argument("profile", metavar="PROFILE", help="profile name or path to a .toml file")
    add_control_options(run_)
    add_controller_options(run_)

    auto = actions.add_parser("auto", help="hand every fan back to the card's automatic control")
    add_control_options(auto)


def run(args: argparse.Namespace) -> int:
    if args.fan_action == "show":
        return _show(args)
    if args.fan_action == "auto":
        return _auto(args)
    check_interval(args)
    profile = load_profile(args.profile)
    return run_fan_curve(args, profile, command_text("fan run", args.profile, gpus_suffix(args)))


def curve_of(profile: Profile) -> FanCurve:
    """The profile's curve, or a UsageError that says what to do instead."""
    if profile.fan_mode != "curve" or profile.curve is None:
        what = "leaves the fans on automatic" if profile.fan_mode == "auto" else "has no [fans]"
        raise UsageError(
            f"profile {profile.name!r} {what}; there is no curve to run. "
            'Use `gpustation fan auto` or a profile with mode = "curve".'
        )
    return profile.curve


def run_fan_curve(
    args: argparse.Namespace,
    profile: Profile,
    command: str,
    backend: Backend | None = None,
    indices: list[int] | None = None,
    banner: bool = True,
) -> int:
    """Check the cards, then (unless --dry-run) run the controller in the foreground."""
    curve = curve_of(profile)
    if backend is None or indices is None:
        with open_gpus(args) as (backend, indices):
            return run_fan_curve(args, profile, command, backend, indices, banner)
    controller = FanController(
        backend=backend,
        indices=indices,
        curve=curve,
        command=command,
        out=sys.stdout,
        interval_s=getattr(args, "interval", None),
    )
    controller.check()  # refuses (exit 5) before anything is touched
    if banner:
        simulated_banner(backend)
    if args.dry_run:
        print(f"Dry run: profile {profile.name!r} would drive these fans; nothing is changed.")
        for card, temp, pct, why in controller.preview():
            shown = "n/a" if temp is None else f"{temp:g} C"
            print(
                f"GPU {card.index}: {card.fans} fan{'s' if card.fans != 1 else ''}, card accepts "
                f"{card.card_min_pct}-{card.card_max_pct} %, curve runs {card.lo_pct}-"
                f"{card.hi_pct} %; now {shown} -> would set {pct} %" + (f" ({why})" if why else "")
            )
        return 0
    busy = running_controllers(indices, backend.simulated)
    if busy:
        raise UsageError(
            "a fan controller is already driving "
            + ", ".join(f"GPU {i} (pid {pid})" for i, pid in sorted(busy.items()))
            + "; stop it first (`gpustation fan auto` does)."
        )
    return controller.run(once=args.once, duration_s=args.duration)


def _show(args: argparse.Namespace) -> int:
    with open_gpus(args) as (backend, indices):
        samples = backend.read_gpus(indices, slow=False)
        controllers = running_controllers(indices, backend.simulated)
        rows = []
        for s in samples:
            count = 0 if s.lost else backend.control.fan_count(s.index)
            rng: tuple[int, int] | None = None
            if count:
                try:
                    rng = backend.control.fan_speed_range(s.index)
                except NotSupportedError:
                    rng = None
            rows.append((s, count, rng))
        unattended = unattended_manual_fans(samples, backend.simulated)
        if args.json:
            print_json(
                {
                    "simulated": backend.simulated,
                    "gpus": [
                        {
                            "index": s.index,
                            "uuid": s.uuid,
                            "name": s.name,
                            "temperature_c": s.temperature_c,
                            "fans": count,
                            "fans_pct": s.fans_pct,
                            "fan_control": s.fan_control,
                            "min_pct": rng[0] if rng else None,
                            "max_pct": rng[1] if rng else None,
                            "controller_pid": controllers.get(s.index),
                            "unattended_manual_fans": unattended.get(s.index, []),
                        }
                        for s, count, rng in rows
                    ],
                }
            )
            return 0
        simulated_banner(backend)
        for s, count, rng in rows:
            temp = "n/a" if s.temperature_c is None else f"{s.temperature_c:g} C"
            head = f"GPU {s.index} ({s.name or 'n/a'}), {temp}: "
            if not count:
                print(head + "no controllable fans")
                continue
            fans = ", ".join(
                f"fan {i} {pct:g} % {mode}"
                for i, (pct, mode) in enumerate(zip(s.fans_pct, s.fan_control, strict=False))
            )
            accepts = f"; accepts {rng[0]}-{rng[1]} %" if rng else ""
            driver = (
                f"; driven by fan controller pid {controllers[s.index]}"
                if s.index in controllers
                else ""
            )
            alone = (
                f"; MANUAL WITH NO CONTROLLER RUNNING: they will not follow the temperature "
                f"({UNATTENDED_HINT})"
                if s.index in unattended
                else ""
            )
            print(head + fans + accepts + driver + alone)
    return 0


def _auto(args: argparse.Namespace) -> int:
    command = command_text("fan auto", gpus_suffix(args))
    with open_gpus(args) as (backend, indices):
        simulated_banner(backend)
        if args.dry_run:
            samples = backend.read_gpus(indices, slow=False)
            with_fans = fan_gpus(backend, samples)
            if not with_fans:
                raise NotSupportedError(
                    "none of the selected GPUs has fans gpustation can control; "
                    "nothing would be changed."
                )
            controllers = running_controllers(indices, backend.simulated)
            print("Dry run: nothing is changed.")
            for s in with_fans:
                stop = (
                    f" (after stopping the fan controller, pid {controllers[s.index]})"
                    if s.index in controllers
                    else ""
                )
                count = backend.control.fan_count(s.index)
                print(f"would return GPU {s.index}'s {count} fans to automatic{stop}")
            return 0
        return report_fan_restores(set_fans_auto(backend, indices, command))
    return 0


def report_fan_restores(restores: list[FanRestore], detail: bool = True) -> int:
    """Say what became of each card's fans; 1 when any fan stayed manual.

    Never claims a fan was handed back when the card refused, and says when
    the journal could not be written (the fans were handed back regardless).
    """
    failed = False
    journal_error = None
    for done in restores:
        journal_error = journal_error or done.journal_error
        back = done.fans - len(done.failed)
        what = (
            f"{back} of {done.fans} fans"
            if done.failed
            else f"{done.fans} fan" + ("s" if done.fans != 1 else "")
        )
        had = f" ({done.were_manual} had been manual)" if detail else ""
        print(f"GPU {done.gpu}: {what} on automatic control{had}")
        for why in done.failed:
            failed = True
            print(f"GPU {done.gpu}: {why}", file=sys.stderr)
    if journal_error:
        print(
            f"gpustation: the fans were handed back, but not journalled: {journal_error}",
            file=sys.stderr,
        )
    return EXIT_FAILURE if failed else 0
