"""``gpustation profile list | show NAME | apply NAME``."""

from __future__ import annotations

import argparse

from gpustation.commands.fan import report_fan_restores, run_fan_curve
from gpustation.commands.options import (
    add_control_options,
    add_controller_options,
    check_interval,
    command_text,
    gpus_suffix,
    open_gpus,
    print_json,
    simulated_banner,
)
from gpustation.commands.power import print_planned
from gpustation.commands.profile_again import apply_again
from gpustation.control.fancurve import FanController, stop_controllers
from gpustation.control.fans import fan_gpus, set_fans_auto
from gpustation.control.power import NOT_PERSISTENT, apply_power, plan_power
from gpustation.control.profiles import Profile, list_profiles, load_profile
from gpustation.errors import NotSupportedError, UsageError
from gpustation.paths import user_profiles_dir
from gpustation.textsafe import safe


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "profile",
        help="list, show or apply hardware profiles (power limit + fan curve)",
        description="Hardware profiles: a power limit and a fan curve in a TOML file. "
        f"Your own go in {user_profiles_dir()}.",
    )
    actions = p.add_subparsers(dest="profile_action", metavar="ACTION", required=True)
    ls = actions.add_parser("list", help="every profile, shipped and your own")
    ls.add_argument("--json", action="store_true", help="print JSON")
    show = actions.add_parser("show", help="a profile's settings and its fan curve")
    show.add_argument("name", metavar="NAME", help="profile name or path to a .toml file")
    apply = actions.add_parser(
        "apply",
        help="apply a profile: power limit, then fans (a curve runs in the foreground)",
        description="Apply a profile to the selected GPUs: the power limit first, then the fans. "
        "A profile with a fan curve keeps running the curve in the foreground until stopped "
        "(the fans then go back to automatic; the power limit stays). `profile apply stock` "
        "restores the default power limit and automatic fans.",
    )
    apply.add_argument(
        "name", metavar="NAME", nargs="?", help="profile name or path to a .toml file"
    )
    apply.add_argument(
        "--again",
        action="store_true",
        help="apply again what the control journal says was applied last, on the cards "
        "whose power limit or fans drifted from it (after a reboot or a driver reload)",
    )
    add_control_options(apply)
    apply.add_argument(
        "--power-only", action="store_true", help="apply only the power limit; leave the fans"
    )
    add_controller_options(apply)


def run(args: argparse.Namespace) -> int:
    if args.profile_action == "list":
        return _list(args)
    if args.profile_action == "show":
        return _show(load_profile(args.name))
    return _apply(args)


def describe(profile: Profile) -> list[str]:
    """A profile in a few lines of text."""
    lines = [f"{profile.name}: {profile.description}" if profile.description else profile.name]
    lines.append(f"  file: {profile.path}")
    lines.append(f"  power limit: {profile.power if profile.power else 'left as it is'}")
    if profile.fan_mode is None:
        lines.append("  fans: left as they are")
    elif profile.fan_mode == "auto":
        lines.append("  fans: automatic (the card's own curve)")
    elif profile.curve is not None:
        c = profile.curve
        pts = ", ".join(f"{t:g} C {p:g} %" for t, p in c.points)
        lines.append(f"  fans: curve ({c.interpolate}): {pts}")
        lines.append(
            f"  between {c.min_pct:g} and {c.max_pct:g} % (never below the card's minimum); "
            f"slows down {c.hysteresis_c:g} C below a step after {c.spin_down_delay_s:g} s; "
            f"polls every {c.poll_interval_s:g} s; full speed within "
            f"{c.emergency_margin_c:g} C of slowdown or when a temperature read fails"
        )
    return lines


def _list(args: argparse.Namespace) -> int:
    items = list_profiles()
    if args.json:
        print_json(
            [
                {
                    "name": i.name,
                    "path": str(i.path),
                    "shipped": i.shipped,
                    "valid": i.error is None,
                    "error": i.error,
                    "description": i.profile.description if i.profile else None,
                    "power_limit": str(i.profile.power) if i.profile and i.profile.power else None,
                    "fans": i.profile.fan_mode if i.profile else None,
                }
                for i in items
            ]
        )
        return 0
    width = max((len(i.name) for i in items), default=4)
    for i in items:
        origin = (
            "shipped"
            if i.shipped
            else ("yours, overrides shipped" if i.overrides_shipped else "yours")
        )
        if i.profile is None:
            print(safe(f"{i.name.ljust(width)}  INVALID ({origin}): {i.error}"))
            continue
        p = i.profile
        power = str(p.power) if p.power else "-"
        fans = p.fan_mode or "-"
        line = f"{i.name.ljust(width)}  power {power:<8} fans {fans:<5}  {p.description}"
        print(safe(f"{line} ({origin})"))
    return 0


def _show(profile: Profile) -> int:
    for line in describe(profile):
        print(safe(line))
    return 0


def _apply(args: argparse.Namespace) -> int:
    if args.again:
        if args.name:
            raise UsageError(
                "profile apply --again takes no NAME: it applies what was applied last; "
                f"to apply a profile: gpustation profile apply {args.name}"
            )
        return apply_again(args)
    if not args.name:
        raise UsageError(
            "profile apply needs a NAME (see `gpustation profile list`), or --again to apply "
            "what was applied last where it drifted"
        )
    check_interval(args)
    profile = load_profile(args.name)  # invalid profiles stop here, before any reading
    command = command_text("profile apply", args.name, gpus_suffix(args))
    fans = None if args.power_only else profile.fan_mode
    with open_gpus(args) as (backend, indices):
        samples = backend.read_gpus(indices, slow=False)
        # Check everything first: power on every card, and the fans a curve needs.
        changes = plan_power(samples, profile.power) if profile.power is not None else []
        fan_samples = fan_gpus(backend, samples) if fans == "auto" else []
        if fans == "curve":
            assert profile.curve is not None
            try:
                FanController(backend, indices, profile.curve, command).check()
            except NotSupportedError as err:
                raise NotSupportedError(
                    f"{err}\nTo apply only the power limit: "
                    f"gpustation profile apply {args.name} --power-only"
                ) from None
        simulated_banner(backend)
        if args.dry_run:
            print(f"Dry run: profile {profile.name!r}; nothing is changed.")
            print_planned(changes)
            if profile.power is None:
                print("power limit: left as it is")
            if fans == "auto":
                for s in fan_samples:
                    print(f"would return GPU {s.index}'s fans to automatic control")
                if not fan_samples:
                    print("no GPU here has controllable fans; fans: nothing to do")
            elif fans == "curve":
                return run_fan_curve(args, profile, command, backend, indices, banner=False)
            else:
                print("fans: left as they are")
            return 0

        if fans is not None:
            # A controller already on these cards would fight the new settings.
            stop_controllers(indices, backend.simulated)
        rc = 0
        if fans == "auto":
            # Fans first: handing them back must not wait on a power change
            # that the journal or the driver may refuse.
            restores = set_fans_auto(backend, indices, command, require_fans=False)
            rc = report_fan_restores(restores, detail=False)
        for change in apply_power(backend, changes, command):
            print(f"set {change.describe()}", flush=True)
        for change in changes:
            if change.unchanged:
                print(f"GPU {change.gpu}: power limit already {change.new_w:g} W")
        if changes:
            print(NOT_PERSISTENT)
        if fans == "curve":
            print(
                "Running the fan curve; stop it with Ctrl-C (the fans go back to automatic, "
                "the power limit stays until `gpustation power reset`).",
                flush=True,
            )
            return run_fan_curve(args, profile, command, backend, indices, banner=False)
        return rc
    return 0
