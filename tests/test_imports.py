"""Every import inside a function says why it is not at module level.

An import waits for its function only for one of a few reasons, named by a
comment on the import's line or on the line just above it (a run of imports
one after another shares the comment above the first):

- ``# start-up time: ...``: a costly module only some paths need (the
  snapshot's import budget in tests/commands/test_snapshot.py is the measure);
- ``# optional extra '...'``: from an optional extra that may be missing;
- ``# cycle: ...``: at module level the two modules would import each other;
- ``# platform: ...``: a module only some systems have;
- ``# guarded: ...``: its failure is handled where it is imported.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gpustation"
REASONS = ("start-up time", "optional extra", "cycle", "platform", "guarded")
_REASON = re.compile(r"#\s*(" + "|".join(re.escape(r) for r in REASONS) + r")\b")


def _function_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(func):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    found.append(node)
    # a nested function's imports are also its parent's: count each once
    return list({id(n): n for n in found}.values())


def reason_of(
    lines: list[str], node: ast.Import | ast.ImportFrom, starts: dict[int, int]
) -> str | None:
    """The reason class a function-level import gives, None without one.

    ``starts`` maps the last line of every import statement to its first.
    """
    for line in lines[node.lineno - 1 : node.end_lineno]:
        if m := _REASON.search(line):
            return m.group(1)
    above = node.lineno - 1
    while above in starts:  # the import just before shares the comment above it
        above = starts[above] - 1
    if above >= 1 and (m := _REASON.match(lines[above - 1].strip())):
        return m.group(1)
    return None


def reasons(source: str) -> list[tuple[int, str | None]]:
    """(line, reason class or None) for each function-level import in ``source``."""
    tree = ast.parse(source)
    lines = source.splitlines()
    starts = {
        n.end_lineno or n.lineno: n.lineno
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
    }
    return [
        (n.lineno, reason_of(lines, n, starts))
        for n in sorted(_function_imports(tree), key=lambda n: n.lineno)
    ]


def test_every_function_level_import_gives_a_reason() -> None:
    missing = []
    counts: Counter[str] = Counter()
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, why in reasons(path.read_text(encoding="utf-8")):
            if why is None:
                missing.append(f"{path.relative_to(PACKAGE.parent)}:{line}")
            else:
                counts[why] += 1
    assert not missing, (
        "function-level imports without a reason: move them to module level, or say why"
        f" in a comment ({', '.join(REASONS)}):\n" + "\n".join(missing)
    )
    assert counts, "the walk found no function-level import at all"


def test_the_reason_may_stand_on_the_line_or_above_a_run_of_imports() -> None:
    source = (
        "def f():\n"
        "    # optional extra 'train'\n"
        "    import torch\n"
        "    from transformers import (\n"
        "        AutoModel,\n"
        "    )\n"
        "    import peft  # cycle: peft imports this module\n"
        "\n"
        "    import json\n"
        "    # a comment that gives no reason\n"
        "    import csv\n"
    )
    assert reasons(source) == [
        (3, "optional extra"),
        (4, "optional extra"),
        (7, "cycle"),
        (9, None),
        (11, None),
    ]
