"""The one parser of documents from elsewhere: size, depth and numbers bounded."""

from __future__ import annotations

import json
import math

import pytest

from gpustation.jsondoc import MAX_DEPTH, DocumentError, loads


def nested(depth: int, inner: bytes = b"1") -> bytes:
    """``depth`` levels, alternating lists and objects."""
    doc = inner
    for level in range(depth):
        doc = b"[" + doc + b"]" if level % 2 else b'{"k":' + doc + b"}"
    return doc


@pytest.mark.parametrize("depth", [1, 10, MAX_DEPTH])
def test_documents_up_to_the_depth_parse_as_json_does(depth: int) -> None:
    doc = nested(depth)
    assert loads(doc, 1 << 20) == json.loads(doc)


@pytest.mark.parametrize(
    "doc",
    [
        nested(MAX_DEPTH + 1),
        b"[" * 100_000,
        b"[" * 100_000 + b"]" * 100_000,
        b'["x", ' + b"{" * 10 + b'"a": ' + b"[" * 100 + b"]" * 100 + b"}" * 10 + b"]",
    ],
)
def test_deeper_documents_are_refused_before_the_parser_recurses(doc: bytes) -> None:
    with pytest.raises(DocumentError, match=f"nested deeper than {MAX_DEPTH} levels"):
        loads(doc, 1 << 20)


def test_brackets_inside_strings_do_not_count() -> None:
    text = "[" * 1000 + '\\"' + "{" * 1000
    doc = json.dumps({"label": text, "other": ["]]]", "\\u005b" * 100, ""]}).encode()
    assert loads(doc, 1 << 20)["label"] == text


def test_mismatched_brackets_are_the_parsers_message() -> None:
    with pytest.raises(DocumentError, match=r"^not JSON \("):
        loads(b"[}" * 1000, 1 << 20)


def test_the_size_cap() -> None:
    with pytest.raises(DocumentError, match="larger than 1 MiB"):
        loads(b" " * ((1 << 20) + 1), 1 << 20)
    assert loads(b" " * 100 + b"[]", 102) == []


def test_numbers_that_are_not_finite_read_as_missing() -> None:
    doc = loads(b'{"a": 1e400, "b": -1e400, "c": NaN, "d": Infinity, "e": 2.5, "f": 3}', 1000)
    assert doc == {"a": None, "b": None, "c": None, "d": None, "e": 2.5, "f": 3}
    assert not any(isinstance(v, float) and not math.isfinite(v) for v in doc.values())


@pytest.mark.parametrize("doc", [b"", b"{", b"\xff\xfe", b"1" * 5000])
def test_what_is_not_json_is_a_document_error(doc: bytes) -> None:
    with pytest.raises(DocumentError, match=r"^not JSON"):
        loads(doc, 1 << 20)
