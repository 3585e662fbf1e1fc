"""The screens' footer: their keys, fitted to the terminal's width.

The screen's own keys come first, then the app's in :data:`APP_KEY_ORDER`.
Where they do not all fit, the footer gives up room in steps until they do:
the keys drawn compact, then related keys under one word (``+ - Refresh``,
``c r t a Screens``), then the palette key (Ctrl+P still opens it), then
the least needed keys. A screen (and the app) says which of its actions are
needed most in ``FOOTER_NEED`` (quitting and help come next); the others go
first, from the end of the footer. Help (``?``) lists every key of every screen.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import Footer, Label

from gpustation.tui.linecache import KeepsLines
from gpustation.tui.widgets import NARROW_W, WIDE_W

#: app keys in the order the footer shows them, after the screen's own keys:
#: moving between screens and quitting before the rest
APP_KEY_ORDER = (
    "quit",
    "show_help",
    "switch_to",
    "show_topology",
    "show_alerts",
    "toggle_pause",
    "cycle_metric",
    "slower",
    "faster",
)
#: actions that share one word in a footer short of room: (actions, the word)
KEY_GROUPS: tuple[tuple[frozenset[str], str], ...] = (
    (frozenset({"slower", "faster"}), "Refresh"),
    (frozenset({"switch_to", "show_topology", "show_alerts"}), "Screens"),
)
#: kept before any key a screen does not name in its ``FOOTER_NEED``
ALWAYS_NEEDED = ("quit", "show_help")
#: columns of the palette key at the right end (its border and margins included)
PALETTE_W = {True: 13, False: 15}


def action_name(action: str) -> str:
    """``switch_to('runs')`` -> ``switch_to``."""
    return action.partition("(")[0]


@dataclass(frozen=True)
class FooterItem:
    """One entry of the footer: a key and what it does, or keys that share a word."""

    keys: tuple[str, ...]
    #: the key's description, or the word the keys share
    description: str
    actions: tuple[str, ...]

    def width(self, compact: bool) -> int:
        """Columns it takes (Textual's footer styles: compact, a margin after each key)."""
        if len(self.keys) == 1:
            key, words = len(self.keys[0]), len(self.description)
            if not words:
                return key + (1 if compact else 0)
            return key + 1 + words + 1 if compact else key + 2 + words + 1
        return sum(len(k) + 1 for k in self.keys) + len(self.description) + 1


@dataclass(frozen=True)
class FooterPlan:
    """What the footer shows: its items, drawn compact or not, with the palette key or not."""

    items: tuple[FooterItem, ...]
    compact: bool
    palette: bool

    def width(self) -> int:
        used = sum(item.width(self.compact) for item in self.items)
        return used + (PALETTE_W[self.compact] if self.palette else 0)


def grouped(items: Sequence[FooterItem]) -> list[FooterItem]:
    """``items`` with neighbours of one :data:`KEY_GROUPS` group merged under its word."""
    out: list[FooterItem] = []
    for item in items:
        group = next((g for g in KEY_GROUPS if set(item.actions) <= g[0]), None)
        last = out[-1] if out else None
        if group is not None and last is not None and set(last.actions) <= group[0]:
            out[-1] = FooterItem((*last.keys, *item.keys), group[1], (*last.actions, *item.actions))
        else:
            out.append(item)
    return out


def fit(
    items: Sequence[FooterItem], width: int, need: Sequence[str], wide: bool, palette: bool
) -> FooterPlan:
    """The footer for ``width`` columns: ``items`` in their order, as much of them as fits.

    ``need``: actions most needed first (those not named are given up first,
    from the end); ``wide``: room enough to try the roomy style; ``palette``:
    the palette key may be shown.
    """
    full = tuple(items)
    tries = [FooterPlan(full, False, palette)] if wide else []
    merged = tuple(grouped(full))
    tries += [
        FooterPlan(full, True, palette),
        FooterPlan(merged, True, palette),
        FooterPlan(merged, True, False),
    ]
    for plan in tries:
        if plan.width() <= width:
            return plan
    rank: dict[str, int] = {}
    for name in need:
        rank.setdefault(name, len(rank))

    def neediness(position: int) -> tuple[int, int]:
        known = [rank[a] for a in merged[position].actions if a in rank]
        # named: by the list; not named: after every named one, the last first to go
        return (min(known), 0) if known else (len(rank), position)

    kept = list(range(len(merged)))
    plan = FooterPlan(merged, True, False)
    while plan.width() > width and len(kept) > 1:
        kept.remove(max(kept, key=neediness))
        plan = FooterPlan(tuple(merged[i] for i in kept), True, False)
    return plan


def ordered(widgets: Iterable[Widget]) -> list[Widget]:
    """The screen's keys first (in their order), then the app's in :data:`APP_KEY_ORDER`."""
    first: list[Widget] = []
    later: list[tuple[int, int, Widget]] = []
    for widget in widgets:
        name = action_name(str(getattr(widget, "action", "")))
        if name in APP_KEY_ORDER:
            later.append((APP_KEY_ORDER.index(name), len(later), widget))
        else:
            first.append(widget)
    return first + [w for _, _, w in sorted(later, key=lambda item: item[:2])]


class KeyWord(Label):
    """The word keys share in the footer (``+ - Refresh``)."""

    DEFAULT_CSS = """
    KeyWord { margin: 0 1 0 0; color: $footer-description-foreground;
              background: $footer-description-background; }
    """


class KeysFooter(KeepsLines, Footer):
    """The ``Footer``, its keys fitted to the width (see the module), keeping its lines."""

    #: the width the keys were last fitted to
    _fitted_w: int | None = None

    def compose(self) -> ComposeResult:
        width = self._fitted_w = self.app.size.width
        self.set_reactive(Footer.show_command_palette, True)
        palette: Widget | None = None
        keys: list[Widget] = []
        fixed: list[Widget] = []
        for widget in super().compose():
            if widget.has_class("-command-palette"):
                palette = widget
            elif isinstance(getattr(widget, "action", None), str) and not widget.has_class(
                "-grouped"
            ):
                keys.append(widget)
            else:
                fixed.append(widget)  # a group of Textual's own: its keys sit inside it
        keys = ordered(keys)
        items = [
            FooterItem(
                (str(getattr(w, "key_display", "")),),
                str(getattr(w, "description", "")),
                (action_name(str(getattr(w, "action", ""))),),
            )
            for w in keys
        ]
        need = [
            *getattr(self.app, "FOOTER_NEED", ()),
            *getattr(self.screen, "FOOTER_NEED", ()),
            *ALWAYS_NEEDED,
        ]
        plan = fit(items, width, need, wide=width >= WIDE_W, palette=width >= NARROW_W)
        self.compact = plan.compact
        yield from fixed
        pending = list(zip(items, keys, strict=True))
        for item in plan.items:
            shown = []
            for key in item.keys:
                n = next(i for i, (one, _) in enumerate(pending) if one.keys == (key,))
                shown.append(pending.pop(n)[1])
            if len(shown) == 1:
                yield shown[0]
                continue
            for widget in shown:
                widget.description = ""  # type: ignore[attr-defined]
                yield widget
            yield KeyWord(item.description)
        if plan.palette and palette is not None:
            yield palette

    def on_resize(self) -> None:
        if self._fitted_w is not None and self.app.size.width != self._fitted_w:
            self.call_after_refresh(self.recompose)
