"""Hardware profiles: a power limit and a fan curve, read from TOML.

A profile is validated in full before anything is touched: every problem in a
file (unknown key, wrong type, curve that goes backwards, percentage outside
0-100, limit that is not a number) is collected and reported together, each
with the file, the key and what was expected.

Profiles ship in ``gpustation/presets/profiles/``; the user's own live in
``<config dir>/presets/profiles/`` and win over a shipped one of the same name.
"""

from __future__ import annotations

import itertools
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpustation.errors import UsageError
from gpustation.files import read_text
from gpustation.paths import package_dir, user_profiles_dir
from gpustation.textsafe import safe

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

# ---- power values ---------------------------------------------------------------

_WATTS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:w|watts?)?\s*$", re.IGNORECASE)
_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


@dataclass(frozen=True, slots=True)
class PowerValue:
    """A power limit as written by the user: watts, % of default, or default."""

    kind: str  # "watts" | "percent" | "default"
    amount: float = 0.0

    def watts_for(self, default_w: float | None) -> float | None:
        """The limit in watts on a card whose default limit is ``default_w``.

        Percentages are rounded to whole watts: drivers take milliwatts, but a
        whole number is what the user will see and can type back.
        """
        if self.kind == "watts":
            return self.amount
        if default_w is None:
            return None
        if self.kind == "default":
            return default_w
        return float(round(default_w * self.amount / 100.0))

    def __str__(self) -> str:
        if self.kind == "default":
            return "default"
        if self.kind == "percent":
            return f"{self.amount:g}%"
        return f"{self.amount:g} W"


def parse_power_value(text: Any) -> PowerValue:
    """Parse ``350``, ``350W``, ``350 w``, ``78%`` or ``default``.

    Raises ``ValueError`` with what is expected; callers add where it came from.
    """
    expected = "expected watts (350, 350W) or a percentage of the default limit (78%) or default"
    if isinstance(text, bool):
        raise ValueError(f"{expected}, got {text!r}")
    if isinstance(text, (int, float)):
        value = float(text)
        if not 0 < value <= 5000:
            raise ValueError(f"expected watts between 1 and 5000, got {text!r}")
        return PowerValue("watts", value)
    if not isinstance(text, str):
        raise ValueError(f"{expected}, got {text!r}")
    if text.strip().lower() == "default":
        return PowerValue("default")
    m = _PERCENT.match(text)
    if m:
        pct = float(m.group(1))
        # Above 100 % is legal (an RTX 4090 goes to 133 %); the card's own
        # range is checked when the profile is applied.
        if not 1 <= pct <= 200:
            raise ValueError(
                f"expected a percentage of the default limit from 1 to 200, got {text!r}"
            )
        return PowerValue("percent", pct)
    m = _WATTS.match(text)
    if m:
        watts = float(m.group(1))
        if not 0 < watts <= 5000:
            raise ValueError(f"expected watts between 1 and 5000, got {text!r}")
        return PowerValue("watts", watts)
    raise ValueError(f"{expected}, got {text!r}")


# ---- fan curves -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FanCurve:
    """Temperature -> fan % points and how the controller follows them."""

    points: tuple[tuple[float, float], ...]
    interpolate: str = "linear"  # "linear" | "step"
    hysteresis_c: float = 3.0
    spin_down_delay_s: float = 10.0
    min_pct: float = 0.0
    max_pct: float = 100.0
    poll_interval_s: float = 2.0
    emergency_margin_c: float = 5.0

    def speed_at(self, temperature_c: float) -> float:
        """The curve's fan % at a temperature, before clamping to min/max.

        Below the first point the first point's speed holds; above the last,
        the last. ``step`` keeps each point's speed until the next point;
        ``linear`` draws straight lines between points.
        """
        pts = self.points
        if temperature_c <= pts[0][0]:
            return pts[0][1]
        if temperature_c >= pts[-1][0]:
            return pts[-1][1]
        for (t0, p0), (t1, p1) in itertools.pairwise(pts):
            if t0 <= temperature_c < t1:
                if self.interpolate == "step":
                    return p0
                return p0 + (p1 - p0) * (temperature_c - t0) / (t1 - t0)
        return pts[-1][1]  # unreachable: the ends are handled above


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    path: Path
    description: str = ""
    #: None: the profile leaves the power limit alone
    power: PowerValue | None = None
    #: "auto", "curve", or None: the profile leaves the fans alone
    fan_mode: str | None = None
    curve: FanCurve | None = None
    shipped: bool = False


# key -> (lowest, highest, default)
_CURVE_NUMBERS: dict[str, tuple[float, float, float]] = {
    "hysteresis_c": (0, 30, 3.0),
    "spin_down_delay_s": (0, 3600, 10.0),
    "min_pct": (0, 100, 0.0),
    "max_pct": (0, 100, 100.0),
    "poll_interval_s": (0.1, 60, 2.0),
    "emergency_margin_c": (0, 30, 5.0),
}
_FAN_KEYS = {"mode", "points", "interpolate", *_CURVE_NUMBERS}
_TOP_KEYS = {"description", "power", "fans"}
_POWER_KEYS = {"limit"}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _parse_curve(fans: dict[str, Any], problems: list[str]) -> FanCurve | None:
    """Check the curve keys of ``[fans]``; append problems, return the curve if sound."""
    bad_before = len(problems)
    points_raw = fans.get("points")
    points: list[tuple[float, float]] = []
    if points_raw is None:
        problems.append("[fans] points: missing; expected a list of [temperature C, fan %] pairs")
    elif not isinstance(points_raw, list) or not points_raw:
        problems.append(
            f"[fans] points: expected a non-empty list of [temperature C, fan %] pairs, "
            f"got {points_raw!r}"
        )
    else:
        for n, pair in enumerate(points_raw):
            where = f"[fans] points[{n}]"
            if not isinstance(pair, list) or len(pair) != 2 or not all(_is_number(v) for v in pair):
                problems.append(
                    f"{where}: expected [temperature C, fan %] as two numbers, got {pair!r}"
                )
                continue
            temp, pct = float(pair[0]), float(pair[1])
            if not 0 <= temp <= 120:
                problems.append(f"{where}: temperature {pair[0]!r} C is outside 0-120 C")
            if not 0 <= pct <= 100:
                problems.append(f"{where}: fan speed {pair[1]!r} % is outside 0-100 %")
            if points:
                prev_t, prev_p = points[-1]
                if temp <= prev_t:
                    problems.append(
                        f"{where}: temperatures must strictly increase, "
                        f"got {temp:g} C after {prev_t:g} C"
                    )
                if pct < prev_p:
                    problems.append(
                        f"{where}: fan speeds must not decrease as temperature rises, "
                        f"got {pct:g} % after {prev_p:g} %"
                    )
            points.append((temp, pct))

    interpolate = fans.get("interpolate", "linear")
    if interpolate not in ("linear", "step"):
        problems.append(f'[fans] interpolate: expected "linear" or "step", got {interpolate!r}')

    numbers: dict[str, float] = {}
    for key, (lo, hi, default) in _CURVE_NUMBERS.items():
        value = fans.get(key, default)
        if not _is_number(value) or not lo <= value <= hi:
            problems.append(f"[fans] {key}: expected a number from {lo:g} to {hi:g}, got {value!r}")
        else:
            numbers[key] = float(value)
    if "min_pct" in numbers and "max_pct" in numbers and numbers["min_pct"] > numbers["max_pct"]:
        problems.append(
            f"[fans] min_pct: {numbers['min_pct']:g} is above max_pct {numbers['max_pct']:g}; "
            "expected min_pct <= max_pct"
        )
    if len(problems) != bad_before:
        return None
    return FanCurve(points=tuple(points), interpolate=str(interpolate), **numbers)


def parse_profile(data: dict[str, Any], name: str, path: Path, shipped: bool = False) -> Profile:
    """Validate a profile's TOML table; raise UsageError listing every problem."""
    problems: list[str] = []
    for key in sorted(set(data) - _TOP_KEYS):
        problems.append(f"{key}: unknown key; expected one of description, [power], [fans]")

    description = data.get("description", "")
    if not isinstance(description, str):
        problems.append(f"description: expected a string, got {description!r}")
        description = ""

    power: PowerValue | None = None
    if "power" in data:
        section = data["power"]
        if not isinstance(section, dict):
            problems.append(f"power: expected a [power] table, got {section!r}")
        else:
            for key in sorted(set(section) - _POWER_KEYS):
                problems.append(f"[power] {key}: unknown key; expected limit")
            if "limit" not in section:
                problems.append(
                    '[power] limit: missing; expected watts ("350W"), a percentage of the '
                    'default ("78%") or "default"'
                )
            else:
                try:
                    power = parse_power_value(section["limit"])
                except ValueError as err:
                    problems.append(f"[power] limit: {err}")

    fan_mode: str | None = None
    curve: FanCurve | None = None
    if "fans" in data:
        fans = data["fans"]
        if not isinstance(fans, dict):
            problems.append(f"fans: expected a [fans] table, got {fans!r}")
        else:
            for key in sorted(set(fans) - _FAN_KEYS):
                problems.append(
                    f"[fans] {key}: unknown key; expected one of {', '.join(sorted(_FAN_KEYS))}"
                )
            mode = fans.get("mode")
            if mode == "auto":
                fan_mode = "auto"
                extra = sorted(set(fans) & (_FAN_KEYS - {"mode"}))
                for key in extra:
                    problems.append(f'[fans] {key}: only used with mode = "curve", not "auto"')
            elif mode == "curve":
                fan_mode = "curve"
                curve = _parse_curve(fans, problems)
            else:
                problems.append(f'[fans] mode: expected "curve" or "auto", got {mode!r}')

    if problems:
        raise UsageError(
            f"profile {name!r} ({path}) is not valid; nothing was changed:\n"
            + "\n".join(f"  {path}: {p}" for p in problems)
        )
    return Profile(
        name=safe(name),
        path=path,
        # shown on the control screen and by `profile list` (rule 8)
        description=safe(description),
        power=power,
        fan_mode=fan_mode,
        curve=curve,
        shipped=shipped,
    )


def load_profile_file(path: Path, name: str | None = None, shipped: bool = False) -> Profile:
    """Read and validate one profile file."""
    name = name or path.stem
    text = read_text(path, "profile")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"profile {name!r} ({path}) is not valid TOML: {err}") from None
    return parse_profile(data, name, path, shipped=shipped)


def shipped_profiles_dir() -> Path:
    return package_dir() / "presets" / "profiles"


def profile_paths() -> dict[str, tuple[Path, bool]]:
    """name -> (file, shipped) for every profile; the user's override shipped ones."""
    found: dict[str, tuple[Path, bool]] = {}
    for directory, shipped in ((shipped_profiles_dir(), True), (user_profiles_dir(), False)):
        if directory.is_dir():
            for path in sorted(directory.glob("*.toml")):
                found[path.stem] = (path, shipped)
    return found


def load_profile(name_or_path: str) -> Profile:
    """A profile by name, or by path when the argument names a .toml file."""
    if name_or_path.endswith(".toml") or "/" in name_or_path:
        return load_profile_file(Path(name_or_path))
    paths = profile_paths()
    if name_or_path not in paths:
        known = ", ".join(sorted(paths)) or "none"
        raise UsageError(
            f"no profile named {name_or_path!r} (profiles: {known}; "
            f"add your own in {user_profiles_dir()})"
        )
    path, shipped = paths[name_or_path]
    return load_profile_file(path, name_or_path, shipped=shipped)


@dataclass(slots=True)
class ProfileListing:
    name: str
    path: Path
    shipped: bool
    profile: Profile | None = None
    error: str | None = None
    overrides_shipped: bool = field(default=False)


def list_profiles() -> list[ProfileListing]:
    """Every profile with its validation result (a broken file is listed, not hidden)."""
    shipped_names = (
        {p.stem for p in shipped_profiles_dir().glob("*.toml")}
        if shipped_profiles_dir().is_dir()
        else set()
    )
    result: list[ProfileListing] = []
    for name, (path, shipped) in sorted(profile_paths().items()):
        item = ProfileListing(
            name=name,
            path=path,
            shipped=shipped,
            overrides_shipped=not shipped and name in shipped_names,
        )
        try:
            item.profile = load_profile_file(path, name, shipped=shipped)
        except UsageError as err:
            item.error = str(err)
        result.append(item)
    return result
