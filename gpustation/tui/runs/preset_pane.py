"""The runs screen's presets pane: the preset list, the highlighted preset's description, problems.

One line per preset (name and title, cut to the list's width), the
highlighted preset's description and what it runs in a fixed number of
lines under it, and the preset files that could not be read, each with its
line and key. Enter on a preset posts the list's ``OptionSelected`` to the
screen, which opens its launch form.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from gpustation.runs.presets import RunPreset
from gpustation.tui.runs.controller import RunsUI
from gpustation.tui.runs.model import INFO_LINES
from gpustation.tui.widgets import LiveText


class PresetPane(Vertical):
    """The preset list (``#runs-presets``), its info lines and the presets' problems."""

    DEFAULT_CSS = "PresetPane { height: auto; }"

    def __init__(self, ui: RunsUI, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ui = ui

    def compose(self) -> ComposeResult:
        yield OptionList(id="runs-presets")
        yield LiveText(id="runs-preset-info")
        yield LiveText(id="runs-problems", wrap=True)

    def on_mount(self) -> None:
        self.query_one("#runs-presets", OptionList).border_title = "Presets (l launches)"

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        self.show_preset_info()

    def show_presets(self) -> None:
        """List the presets (cut to the list's width) and the problems reading them."""
        if not self.is_mounted:
            return
        ui = self.ui
        options = self.query_one("#runs-presets", OptionList)
        problems = self.query_one("#runs-problems", LiveText)
        if ui.presets is None:
            problems.show(Text("reading the presets…", style="dim"), layout=True)
            return
        highlighted = options.highlighted
        options.clear_options()
        width = max(20, options.content_region.width or 56)
        name_w = min(24, max((len(p.name) for p in ui.presets.values()), default=0))
        entries = []
        for p in ui.presets.values():
            # One line per preset: a wrapped title would make the list hard to scan.
            label = Text.assemble((f"{p.name:<{name_w}}", "bold"), "  ", (p.title or "", "dim"))
            label.truncate(width, overflow="ellipsis")
            entries.append(Option(label, id=p.name))
        options.add_options(entries)
        if ui.presets:
            options.highlighted = min(highlighted or 0, len(ui.presets) - 1)
        t = Text()
        for problem in ui.problems:
            t.append("✗ ", style="bold red")
            t.append(f"{Path(problem.path).name}")
            if problem.line is not None:
                t.append(f":{problem.line}")
            t.append(f" {('[' + problem.key + '] ') if problem.key else ''}{problem.message}\n")
        t.rstrip()
        problems.show(t, layout=True)
        self.show_preset_info()

    def highlighted_preset(self) -> RunPreset | None:
        """The preset under the list's cursor (None: none read yet, or none there)."""
        presets = self.ui.presets
        options = self.query_one("#runs-presets", OptionList)
        if not presets or options.highlighted is None:
            return None
        option = options.get_option_at_index(options.highlighted)
        return presets.get(option.id or "")

    def show_preset_info(self) -> None:
        """The highlighted preset's description and what it runs, in ``INFO_LINES`` lines."""
        preset = self.highlighted_preset()
        info = self.query_one("#runs-preset-info", LiveText)
        width = max(20, info.content_region.width or 58)
        lines: list[Text] = []
        if preset is not None:
            about = Text(preset.description or preset.display_title)
            lines = list(about.wrap(self.app.console, width, overflow="ellipsis"))[:2]
            where = preset.runner or " ".join(preset.command or [])
            lines.append(Text(f"{preset.launcher}: {where}", style="dim"))
        # Always INFO_LINES lines: moving through the list never relayouts the screen.
        lines += [Text("")] * (INFO_LINES - len(lines))
        for line in lines:
            line.truncate(width, overflow="ellipsis")
        info.show(Text("\n").join(lines[:INFO_LINES]))
