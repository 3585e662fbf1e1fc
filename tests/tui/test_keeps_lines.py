"""Widgets that hand the compositor their last strips until they change."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.geometry import Region

from gpustation.tui.footer import KeysFooter
from gpustation.tui.widgets import LiveText, Rows, ScrollRows


class Page(App[None]):
    CSS = "#box { height: 5; } .hot { color: red; }"

    def compose(self) -> ComposeResult:
        with ScrollRows(id="body"), Rows(id="box"):
            yield LiveText("first line\nsecond line", id="text")
            yield LiveText("a neighbour", id="other")
        yield KeysFooter()


def plain(strips: list) -> list[str]:  # type: ignore[type-arg]
    return [strip.text for strip in strips]


async def test_kept_strips_are_given_back_until_the_widget_changes() -> None:
    app = Page()
    async with app.run_test(size=(40, 10)) as pilot:
        await pilot.pause()
        text = app.query_one("#text", LiveText)
        crop = Region(0, 0, text.size.width, text.size.height)
        first = text.render_lines(crop)
        assert text.render_lines(crop) is first  # nothing changed: the same strips
        assert plain(first)[0].startswith("first line")

        text.show("changed line\nsecond line")  # new content
        changed = text.render_lines(crop)
        assert changed is not first and plain(changed)[0].startswith("changed line")

        before_style = text.render_lines(crop)
        text.add_class("hot")  # a style change repaints it too
        await pilot.pause()
        restyled = text.render_lines(crop)
        assert restyled is not before_style
        assert restyled[0] != before_style[0] and plain(restyled) == plain(before_style)

        box = app.query_one("#box", Rows)  # a container: its own lines are background
        box_crop = Region(0, 0, box.size.width, box.size.height)
        plain_box = box.render_lines(box_crop)
        assert box.render_lines(box_crop) is plain_box
        box.styles.background = "red"
        await pilot.pause()
        red_box = box.render_lines(box_crop)
        assert red_box[-1] != plain_box[-1]

        other = Region(0, 1, text.size.width, 1)  # another crop: rendered for it
        assert plain(text.render_lines(other)) == plain(restyled)[1:2]


async def test_a_neighbour_s_change_keeps_the_strips_and_a_new_size_drops_them() -> None:
    app = Page()
    async with app.run_test(size=(40, 10)) as pilot:
        await pilot.pause()
        text = app.query_one("#text", LiveText)
        other = app.query_one("#other", LiveText)
        crop = Region(0, 0, text.size.width, text.size.height)
        first = text.render_lines(crop)
        other.show("a new neighbour")  # repainted beside it, not in it
        await pilot.pause()
        assert text.render_lines(crop) is first
        assert plain(other.render_lines(Region(0, 0, other.size.width, 1)))[0].startswith(
            "a new neighbour"
        )

        # A new terminal size gives the widget a new size without a refresh
        # of its own: it is drawn afresh for the new size.
        await pilot.resize_terminal(30, 10)
        await pilot.pause()
        assert text.size.width == 30
        resized = text.render_lines(Region(0, 0, 30, 2))
        assert resized is not first
        assert [s.cell_length for s in resized] == [30, 30]
        assert plain(resized)[0].startswith("first line")


async def test_keeping_subclasses_keep_their_textual_stylesheet() -> None:
    # The mixin must not hide the Textual class's CSS: the footer docks at the
    # bottom and the scroll container fills the rest.
    app = Page()
    async with app.run_test(size=(40, 10)) as pilot:
        await pilot.pause()
        footer = app.query_one(KeysFooter)
        assert footer.region.y == 9 and footer.region.height == 1
        assert app.query_one("#box", Rows).region.height == 5
        # Textual's own CSS type names still select them.
        assert app.query_one("Footer") is footer
        assert app.query_one("VerticalScroll#body") is app.query_one("#body", ScrollRows)
