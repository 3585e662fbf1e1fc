"""What torch makes of this machine, as one JSON line on stdout: its version,
the CUDA it was built for, the GPUs it sees and its NCCL.

``gpustation doctor`` runs it as a child (``python -m
gpustation.runners.lib.torchprobe``) so that torch stays out of every other
process. It changes nothing; it does not even create a CUDA context beyond
what asking for the device names needs.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def probe() -> dict[str, Any]:
    try:
        import torch  # optional extra 'train'
    except ImportError as err:
        return {"torch": None, "error": f"{type(err).__name__}: {err}"}
    out: dict[str, Any] = {
        "torch": str(torch.__version__),
        "cuda_built": torch.version.cuda,
        "cuda_available": False,
        "devices": [],
        "nccl": None,
    }
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
        if out["cuda_available"]:
            out["devices"] = [
                torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
            ]
        nccl = getattr(torch.cuda, "nccl", None)
        if nccl is not None and out["cuda_available"]:
            version = nccl.version()
            out["nccl"] = (
                ".".join(str(v) for v in version) if isinstance(version, tuple) else (str(version))
            )
    except Exception as err:  # a broken CUDA install is an answer, not a crash
        out["error"] = f"{type(err).__name__}: {err}"
    return out


if __name__ == "__main__":
    sys.stdout.write(json.dumps(probe()) + "\n")
