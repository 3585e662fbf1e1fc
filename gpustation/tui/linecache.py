"""The dashboard's one speed measure in drawing: widgets that keep their lines.

When any part of the screen is repainted, Textual asks every widget whose
clip overlaps the box around all repainted regions for every one of its
lines, and builds each again from its line cache: the background colours
looked up through the ancestors, the line filters applied to every line.
With a GPU card, the graph and the host pane changing each second, that box
is most of the screen: about a dozen widgets and 150 lines a tick for a few
changed ones. :class:`KeepsLines` hands the compositor the strips it gave
last time until the widget changes. What that saves is measured in
``bench/RESULTS.md`` (the dashboard's steady CPU, beside nvitop's).

Only public Textual API is used. Textual repaints a widget's content for
one of two reasons: ``refresh()`` (new content, styles, theme, focus, a
border title: every such path calls it) or a new size. So the kept strips
are dropped in :meth:`KeepsLines.refresh`, and the key they are kept under
holds the widget's size, the crop asked for and the line filters in use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.geometry import Region, Size
from textual.strip import Strip

if TYPE_CHECKING:
    from textual.widget import Widget
    from typing_extensions import Self

    _WidgetBase = Widget
else:
    _WidgetBase = object


class KeepsLines(_WidgetBase):
    """Gives the compositor back the strips it had last time, until the widget changes.

    A mixin, named before the Textual class it extends (``class
    Rows(KeepsLines, Vertical)``): not being a widget itself, it leaves that
    class's stylesheet and CSS type name to the subclass.
    """

    _kept: tuple[Region, Size, tuple[object, ...], list[Strip]] | None = None

    def refresh(
        self, *regions: Region, repaint: bool = True, layout: bool = False, recompose: bool = False
    ) -> Self:
        if repaint:
            self._kept = None
        return super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)

    def render_lines(self, crop: Region) -> list[Strip]:
        filters = tuple(self.get_line_filters())
        size = self.size
        kept = self._kept
        if kept is not None and kept[0] == crop and kept[1] == size and kept[2] == filters:
            return kept[3]
        strips = super().render_lines(crop)
        self._kept = (crop, size, filters, strips)
        return strips
