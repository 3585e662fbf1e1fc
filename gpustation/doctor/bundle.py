"""A support bundle: what someone helping needs to see, in one file.

A zip (``FILE.zip``) or a zstd-compressed tar (``FILE.tar.zst``) holding the
doctor's report with the versions, the snapshot JSON (topology included), the
control journal's tail, the error tails of recent runs and the kernel log's
NVRM and Xid lines where they could be read. Secrets are hidden
(:func:`gpustation.redact.redact_words`) and other users' command lines are
left out: only this user's processes keep theirs.
"""

from __future__ import annotations

import io
import json
import os
import pwd
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Any

import zstandard

from gpustation import private
from gpustation.control import journal
from gpustation.doctor.checks import Findings
from gpustation.errors import UsageError
from gpustation.privs import invoking_user
from gpustation.redact import redact_words
from gpustation.runs.store.index import RunStore

#: how much of the control journal comes along (its newest lines)
JOURNAL_TAIL_LINES = 200
#: how many of the latest runs' error tails
RECENT_RUNS = 10
_FORMATS = (".zip", ".tar.zst")


def check_name(path: Path) -> None:
    """Refuse a bundle name of another kind before anything is read."""
    if not path.name.endswith(_FORMATS):
        raise UsageError(
            f"--bundle {path}: name it FILE.zip or FILE.tar.zst (the kind of archive to write)"
        )
    if not path.parent.is_dir():
        raise UsageError(f"--bundle {path}: the folder {path.parent} does not exist")


def _user() -> str | None:
    user = invoking_user()
    if user is not None:
        return user.name
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except (KeyError, ImportError):
        return None


def scrub_snapshot(doc: dict[str, Any], me: str | None) -> dict[str, Any]:
    """The snapshot document with other users' command lines left out and
    secrets hidden in the rest."""
    for gpu in doc.get("gpus") or ():
        for key in ("processes", "device_holders"):
            for proc in gpu.get(key) or ():
                command = proc.get("command")
                if command is None:
                    continue
                proc["command"] = redact_words(command) if me and proc.get("user") == me else None
        mig = gpu.get("mig") or {}
        for inst in mig.get("instances") or ():
            for proc in inst.get("processes") or ():
                if proc.get("user") != me:
                    proc["command"] = None
                elif proc.get("command"):
                    proc["command"] = redact_words(proc["command"])
    return doc


def _journal_tail() -> str:
    try:
        with open(journal.journal_path(), "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 256 * 1024))
            lines = fh.read().decode("utf-8", "replace").splitlines()[-JOURNAL_TAIL_LINES:]
    except OSError:
        return ""
    return "".join(redact_words(line) + "\n" for line in lines)


def _run_tails() -> str:
    try:
        runs = RunStore().list_runs(limit=RECENT_RUNS)
    except Exception as err:  # a damaged store must not stop the bundle
        return f"runs could not be listed: {type(err).__name__}: {err}\n"
    out: list[str] = []
    for run in runs:
        if not run.error_tail:
            continue
        out.append(f"== run {run.id} ({run.status}, {run.reason or 'no reason'})")
        out += [redact_words(line) for line in run.error_tail]
    return "".join(line + "\n" for line in out)


def members(findings: Findings, report: dict[str, Any]) -> dict[str, bytes]:
    """File name in the bundle -> its content."""
    me = _user()
    files: dict[str, bytes] = {
        "doctor.json": json.dumps(report, indent=2).encode(),
    }
    if findings.snapshot is not None:
        doc = scrub_snapshot(findings.snapshot.to_dict(), me)
        files["snapshot.json"] = json.dumps(doc, indent=2).encode()
    files["control-journal-tail.jsonl"] = _journal_tail().encode()
    files["runs-error-tails.txt"] = _run_tails().encode()
    if findings.kernel_lines is None:
        files["dmesg-nvidia.txt"] = b"the kernel log was not readable as this user\n"
    else:
        text = "".join(redact_words(line) + "\n" for line in findings.kernel_lines)
        files["dmesg-nvidia.txt"] = text.encode()
    return files


def write_bundle(path: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` as a zip or a tar.zst (by ``path``'s name), readable by
    its owner alone: it names the machine, its processes and its runs."""

    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    now = time.time()
    with open(tmp, "xb", opener=private.opener) as fh:
        if path.name.endswith(".zip"):
            with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_DEFLATED) as zf:
                for name, data in files.items():
                    zf.writestr(f"gpustation-support/{name}", data)
        else:
            with (
                zstandard.ZstdCompressor().stream_writer(fh, closefd=False) as zw,
                tarfile.open(fileobj=zw, mode="w|") as tf,
            ):
                for name, data in files.items():
                    info = tarfile.TarInfo(f"gpustation-support/{name}")
                    info.size, info.mtime, info.mode = len(data), int(now), 0o600
                    tf.addfile(info, io.BytesIO(data))
    os.replace(tmp, path)
