"""Static values of each GPU kept in a file between one-shot snapshots.

Temperature thresholds, the power limit's range, maximum clocks and the like
are slow for the driver the first time a process asks, and they cannot change
while the machine is up with the same driver. The file is keyed by the boot
and the driver version, each entry by the GPU's UUID and bus id; anything that
does not match, or does not look right, is read from the driver instead. Its
keys are the fields declared ``STATIC`` in the model. Only ``gpustation
snapshot`` uses it (``one_shot=True``): control and the dashboard always ask
the driver. It is written with :mod:`marshal`, which is built in.
"""

from __future__ import annotations

import marshal
import os
from typing import Any

from gpustation import private

#: The file, in the state directory, that keeps static values between one-shot runs.
STATIC_CACHE_FILE = "nvml-static.marshal"
#: far more than the entries of a machine's GPUs take; a larger file is not read
MAX_CACHE_BYTES = 1 << 20


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


class StaticCache:
    """``fill`` and ``remember`` the static values of a GPU, by UUID and bus id."""

    def __init__(
        self, path: str, driver: str | None, keys: tuple[str, ...], boot_id: str | None = None
    ) -> None:
        self.path = path
        self.keys = keys
        boot = boot_id if boot_id is not None else _boot_id()
        self.key = f"{boot}/{driver}" if boot and driver else None
        self._entries: dict[str, Any] = {}
        self._changed = False
        if self.key is None:
            return
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_CACHE_BYTES + 1)
            if len(data) > MAX_CACHE_BYTES:
                return
            doc = marshal.loads(data)
        # missing, damaged, another Python's, or crafted (a list of a billion items
        # declared in five bytes is a MemoryError): read from the driver, rewritten
        except Exception:
            return
        if isinstance(doc, dict) and doc.get("key") == self.key:
            gpus = doc.get("gpus")
            if isinstance(gpus, dict):
                self._entries = gpus

    def get(self, uuid: str | None, bus_id: str | None) -> dict[str, Any] | None:
        """The GPU's static values, or ``None`` when the file has none that look right."""
        entry = self._entries.get(uuid or "")
        if not isinstance(entry, dict) or entry.get("pci_bus_id") != bus_id:
            return None
        values = {}
        for key in self.keys:
            if key not in entry:
                return None
            value = entry[key]
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float))
            ):
                return None
            values[key] = value
        return values

    def remember(self, uuid: str | None, bus_id: str | None, values: dict[str, Any]) -> None:
        if self.key is None or not uuid:
            return
        entry = {key: values.get(key) for key in self.keys}
        entry["pci_bus_id"] = bus_id
        self._entries[uuid] = entry
        self._changed = True

    def save(self) -> None:
        """Write the file if something new was learnt (atomically; errors ignored)."""
        if not self._changed or self.key is None:
            return
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            with open(tmp, "wb", opener=private.opener) as f:
                marshal.dump({"key": self.key, "gpus": self._entries}, f)
            os.replace(tmp, self.path)
            self._changed = False
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
