"""Key bindings remapped by the [keys] table of config.toml."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpustation.tui.keyids import keymap_from_config, known_binding_ids
from gpustation.tui.keys import load_keymap, parse_keys
from gpustation.tui.screens import DashboardScreen, HelpScreen

from .conftest import first_frame, make_app, notifications, wait_for

pytestmark = pytest.mark.timeout(120)


def write_config(config_dir: Path, text: str) -> None:
    (config_dir / "config.toml").write_text(text)


async def test_a_remapped_key_runs_the_action_and_the_default_key_no_longer_does(
    gpustation_dirs: dict[str, Path],
) -> None:
    write_config(
        gpustation_dirs["config"],
        '[keys]\n"app.metric" = "x"\n"dashboard.sort" = ["o", "f5"]\n',
    )
    # read as the dashboard command reads it, and handed to the app
    app, _ = make_app(count=2, keymap=keymap_from_config())
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        assert app.metric == "util"
        await pilot.press("m")  # the default key is replaced, not added to
        await pilot.pause()
        assert app.metric == "util"
        await pilot.press("x")
        await wait_for(pilot, lambda: app.metric != "util")

        screen = app.screen
        assert isinstance(screen, DashboardScreen)
        table = screen.query_one("#procs")
        before = table.sort_key  # type: ignore[attr-defined]
        await pilot.press("f5")
        await wait_for(pilot, lambda: table.sort_key != before)  # type: ignore[attr-defined]
        assert notifications(app) == []

        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        help_text = app.screen.query_one("#help").plain  # type: ignore[attr-defined]
        assert "x         Metric" in help_text  # help shows the keys in force
        assert "o, f5     Sort" in help_text


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ('keys = "ctrl+k"\n', "[keys] must be a table"),
        ('[keys]\n"dashboard.kil" = "ctrl+k"\n', "unknown binding id 'dashboard.kil'"),
        ('[keys]\n"app.metric" = 5\n', "'app.metric' must be a key string"),
        ('[keys\n"app.metric" = "x"\n', "not valid TOML"),
    ],
    ids=["not-a-table", "unknown-id", "not-a-string", "not-toml"],
)
async def test_a_bad_keys_table_is_reported_and_the_defaults_stay(
    gpustation_dirs: dict[str, Path], config: str, named: str
) -> None:
    write_config(gpustation_dirs["config"], config)
    app, _ = make_app(count=1, keymap=keymap_from_config())
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        await wait_for(pilot, lambda: any(named in n for n in notifications(app)))
        assert str(gpustation_dirs["config"] / "config.toml") in notifications(app)[0]
        await pilot.press("m")  # the default key still works
        await wait_for(pilot, lambda: app.metric != "util")


def test_good_entries_stay_when_another_is_bad() -> None:
    config = parse_keys(
        {"app.quit": "ctrl+q, q", "dashboard.kill": ["k", "ctrl+k"], "app.pause": ["p", 3]},
        known={"app.quit", "dashboard.kill", "app.pause"},
    )
    assert config.keymap == {"app.quit": "ctrl+q,q", "dashboard.kill": "k,ctrl+k"}
    assert len(config.problems) == 1 and "'app.pause'" in config.problems[0]


def test_every_screen_s_binding_ids_are_known(gpustation_dirs: dict[str, Path]) -> None:
    ids = known_binding_ids()
    for binding_id in (
        "app.quit",
        "app.control",
        "dashboard.kill",
        "control.power",
        "fleet.sort",
        "replay.play",
    ):
        assert binding_id in ids
    # no config.toml: the defaults, and no screen imported to check ids
    asked: list[str] = []

    def known() -> set[str]:
        asked.append("the screens")
        return set()

    config = load_keymap(known)
    assert config.keymap == {} and config.problems == [] and asked == []
