"""The model's record classes behave as the dataclasses they replace."""

from __future__ import annotations

import copy
import pickle

import pytest

from gpustation.telemetry.slotted import field, fields, record


@record
class Point:
    x: int
    y: int = 0
    tags: list[str] = field(default_factory=list, metadata={"unit": "none"})

    @property
    def norm1(self) -> int:
        return abs(self.x) + abs(self.y)


@record(frozen=True)
class Key:
    name: str
    part: int | None = None


def test_positional_keyword_default_and_factory() -> None:
    p = Point(1, y=2)
    assert (p.x, p.y, p.tags, p.norm1) == (1, 2, [], 3)
    a, b = Point(0), Point(0)
    a.tags.append("t")
    assert b.tags == []  # each record gets its own list
    assert Point(5).y == 0


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match="missing argument 'x'"):
        Point()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected arguments"):
        Point(1, z=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="positional"):
        Point(1, 2, [], 4)  # type: ignore[call-arg]


def test_equality_repr_slots_copy_and_pickle() -> None:
    p = Point(1, 2, ["a"])
    assert p == Point(1, 2, ["a"]) and p != Point(1, 3, ["a"])
    assert repr(p) == "Point(x=1, y=2, tags=['a'])"
    assert not hasattr(p, "__dict__")
    with pytest.raises(AttributeError):
        p.other = 1  # type: ignore[attr-defined]
    assert copy.deepcopy(p) == p and copy.deepcopy(p).tags is not p.tags
    assert pickle.loads(pickle.dumps(p)) == p
    with pytest.raises(TypeError):
        hash(p)  # mutable records are not hashable, as with dataclasses


def test_frozen_records_hash_and_refuse_changes() -> None:
    k = Key("power", 1)
    assert hash(k) == hash(Key("power", 1)) and {k: 1}[Key("power", 1)] == 1
    with pytest.raises(AttributeError, match="frozen"):
        k.part = 2  # type: ignore[misc]


def test_fields_in_order_with_metadata() -> None:
    table = fields(Point)
    assert [f.name for f in table] == ["x", "y", "tags"]
    assert table[2].metadata == {"unit": "none"} and table[0].metadata == {}
