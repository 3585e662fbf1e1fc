"""The lite NVML binding against nvidia-ml-py: same names, values, layouts and answers.

Without a GPU the answers are checked against a stand-in ``libnvidia-ml.so.1``
compiled from the C source below: pynvml and the lite binding load the same
library in a child process (through ``LD_LIBRARY_PATH``) and must agree on
every call the NVML backend makes, errors included, and so must the snapshots
the backend builds on each.
"""

from __future__ import annotations

import ctypes
import inspect
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pynvml
import pytest

from gpustation.errors import EXIT_NO_DRIVER, EXIT_USAGE, NoDriverError, UsageError
from gpustation.telemetry import nvml_lite
from gpustation.telemetry.nvml import NvmlBackend
from tests.conftest import REPO, child_env, gpustation_cmd

BACKEND_SOURCE = (REPO / "gpustation" / "telemetry" / "nvml.py").read_text()


def _names_the_backend_uses() -> set[str]:
    """Every NVML function, constant and error name nvml.py reaches for, however."""
    names = set(re.findall(r"\"(NVMLError|nvml[A-Z]\w*|NVML_\w+)\"", BACKEND_SOURCE))
    names |= set(re.findall(r"\bnvml\.(nvml[A-Z]\w*|NVML\w*)", BACKEND_SOURCE))
    names |= set(re.findall(r"\bnvml_lite\.(nvml[A-Z]\w*|NVML\w*)", BACKEND_SOURCE))
    return names


USED = _names_the_backend_uses()
LITE_PUBLIC = sorted(n for n in vars(nvml_lite) if n.startswith(("nvml", "NVML")))
LITE_FUNCTIONS = [n for n in LITE_PUBLIC if inspect.isfunction(getattr(nvml_lite, n))]
STRUCTS = sorted(nvml_lite._TYPE_NAMES - {"c_nvmlDevice_t"})


def test_the_installed_pynvml_is_the_real_one() -> None:
    # Everything below compares against it; the fake in tests/fake_nvml would prove nothing.
    assert "fake_nvml" not in str(pynvml.__file__)
    assert hasattr(pynvml, "c_nvmlMemory_v2_t")


def test_the_name_scan_sees_the_backend() -> None:
    # Guards the scan itself: names reached by string, by attribute and by getattr.
    assert {
        "nvmlInit",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetMemoryInfo",
        "nvmlMemory_v2",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "NVML_P2P_CAPS_INDEX_READ",
        "NVMLError",
    } <= USED
    assert len(USED) > 60


@pytest.mark.parametrize("name", sorted(USED))
def test_every_name_the_backend_uses_is_there_as_in_pynvml(name: str) -> None:
    # A name pynvml lacks (e.g. nvmlDeviceGetNvLinkRemotePciInfo_v2) must be
    # missing here too, so the backend's fallbacks run the same way on both.
    assert hasattr(nvml_lite, name) == hasattr(pynvml, name), name


@pytest.mark.parametrize("name", LITE_PUBLIC)
def test_every_public_name_is_pynvml_s_with_its_value(name: str) -> None:
    assert hasattr(pynvml, name), f"{name} is not a pynvml name"
    value = getattr(nvml_lite, name)
    if not callable(value):
        assert value == getattr(pynvml, name), name


@pytest.mark.parametrize("name", LITE_FUNCTIONS)
def test_signatures_match_pynvml(name: str) -> None:
    def shape(fn: Any) -> list[tuple[str, Any, bool]]:
        params = inspect.signature(inspect.unwrap(fn)).parameters.values()
        return [(p.name, p.kind, p.default is not p.empty) for p in params]

    assert shape(getattr(nvml_lite, name)) == shape(getattr(pynvml, name))


@pytest.mark.parametrize("name", STRUCTS)
def test_structures_have_pynvml_layouts(name: str) -> None:
    ours, theirs = getattr(nvml_lite, name), getattr(pynvml, name)
    assert ctypes.sizeof(ours) == ctypes.sizeof(theirs)
    assert ctypes.alignment(ours) == ctypes.alignment(theirs)

    def layout(cls: Any) -> list[tuple[str, int, int]]:
        return [
            (f[0], getattr(cls, f[0]).offset, getattr(cls, f[0]).size)
            for f in getattr(cls, "_fields_", ())
        ]

    assert layout(ours) == layout(theirs)


def test_versioned_memory_struct_word_is_its_size_and_version() -> None:
    assert nvml_lite.nvmlMemory_v2 == ctypes.sizeof(nvml_lite.c_nvmlMemory_v2_t) | 2 << 24


def test_device_handle_is_a_pointer_like_pynvml_s() -> None:
    ours, theirs = nvml_lite.c_nvmlDevice_t, pynvml.c_nvmlDevice_t
    assert ctypes.sizeof(ours) == ctypes.sizeof(theirs) == ctypes.sizeof(ctypes.c_void_p)
    assert issubclass(ours, ctypes._Pointer)


def test_byte_string_fields_read_as_str() -> None:
    for module in (nvml_lite, pynvml):
        info = module.nvmlPciInfo_t()
        info.busId = "00000000:01:00.0"
        assert info.busId == "00000000:01:00.0"
        assert str(info).startswith("nvmlPciInfo_t(")


def test_import_is_cheap_it_loads_no_ctypes() -> None:
    # The point of the module: importing it must not pull in ctypes (nor
    # typing or threading); that happens on nvmlInit().
    code = (
        "import sys; before = set(sys.modules); import gpustation.telemetry.nvml_lite; "
        "added = sorted(set(sys.modules) - before); import json; print(json.dumps(added))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=child_env()
    )
    assert result.returncode == 0, result.stderr
    added = set(json.loads(result.stdout))
    allowed = {"gpustation", "gpustation.telemetry", "gpustation.telemetry.nvml_lite"}
    # `from __future__ import annotations` loads that tiny module where nothing has yet
    assert added - {"__future__"} <= allowed


# ---- without the library -------------------------------------------------------


@pytest.fixture
def no_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lite binding looks only where there is no library, from a fresh state."""
    monkeypatch.setattr(nvml_lite, "_LIBRARY_NAMES", (str(tmp_path / "libnvidia-ml.so.1"),))
    monkeypatch.setattr(nvml_lite, "_lib", None)
    monkeypatch.setattr(nvml_lite, "_fns", {})
    monkeypatch.delenv("GPUSTATION_NVML", raising=False)


@pytest.mark.usefixtures("no_library")
def test_init_without_library_is_library_not_found() -> None:
    with pytest.raises(nvml_lite.NVMLError) as info:
        nvml_lite.nvmlInit()
    assert info.value.value == nvml_lite.NVML_ERROR_LIBRARY_NOT_FOUND == 12
    assert str(info.value) == "NVML Shared Library Not Found"
    # Nothing was loaded, so any call is "uninitialized", as with pynvml.
    with pytest.raises(nvml_lite.NVMLError) as info:
        nvml_lite.nvmlDeviceGetCount()
    assert info.value.value == nvml_lite.NVML_ERROR_UNINITIALIZED
    with pytest.raises(nvml_lite.NVMLError) as info:
        nvml_lite.nvmlDeviceGetClockInfo(None, nvml_lite.NVML_CLOCK_SM)
    assert info.value.value == nvml_lite.NVML_ERROR_UNINITIALIZED


@pytest.mark.usefixtures("no_library")
def test_errors_read_and_compare_like_pynvml_s() -> None:
    for code in (3, 9, 13, 15, 999):
        assert str(nvml_lite.NVMLError(code)) == str(pynvml.NVMLError(code))
    # Not in the table and no library to ask: the same fallback text as pynvml.
    assert str(nvml_lite.NVMLError(77)) == "NVML Error with code 77"
    assert nvml_lite.NVMLError(3) == nvml_lite.NVMLError(3) != nvml_lite.NVMLError(4)
    assert len({nvml_lite.NVMLError(3), nvml_lite.NVMLError(3)}) == 1


@pytest.mark.usefixtures("no_library")
def test_backend_without_library_is_no_driver_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no nvidia-ml-py to fall back on
    with pytest.raises(NoDriverError) as info:
        NvmlBackend()
    assert info.value.exit_code == EXIT_NO_DRIVER == 3
    message = str(info.value)
    assert "NVML Shared Library Not Found" in message and "--simulate" in message


@pytest.mark.usefixtures("no_library")
def test_backend_falls_back_to_pynvml_when_the_library_cannot_load(
    fake_nvml: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUSTATION_NVML")  # the fixture asks for pynvml; ask for nothing
    with NvmlBackend() as backend:
        assert backend.nvml is fake_nvml
        assert backend.device_count() == 2


@pytest.mark.usefixtures("no_library")
def test_no_fallback_when_the_driver_itself_refuses(
    fake_nvml: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    def driver_not_loaded() -> None:
        raise nvml_lite.NVMLError(nvml_lite.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.delenv("GPUSTATION_NVML")
    monkeypatch.setattr(nvml_lite, "nvmlInit", driver_not_loaded)
    with pytest.raises(NoDriverError, match="Driver Not Loaded"):
        NvmlBackend()
    assert fake_nvml.DRIVER.initialized == 0  # pynvml was not tried


@pytest.mark.usefixtures("no_library")
def test_a_broken_binding_falls_back_to_pynvml(
    fake_nvml: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> None:
        raise TypeError("something in the binding is wrong")

    monkeypatch.delenv("GPUSTATION_NVML")
    monkeypatch.setattr(nvml_lite, "nvmlInit", broken)
    with NvmlBackend() as backend:
        assert backend.nvml is fake_nvml


def test_env_selects_pynvml(fake_nvml: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_run() -> None:
        raise AssertionError("the lite binding was used")

    monkeypatch.setattr(nvml_lite, "nvmlInit", must_not_run)
    monkeypatch.setenv("GPUSTATION_NVML", "pynvml")
    with NvmlBackend() as backend:
        assert backend.nvml is fake_nvml


def test_unknown_binding_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSTATION_NVML", "nvml-py")
    with pytest.raises(UsageError, match="GPUSTATION_NVML") as info:
        NvmlBackend()
    assert info.value.exit_code == EXIT_USAGE


# ---- against a stand-in libnvidia-ml.so.1 ----------------------------------------

# Two GPUs with fixed answers, unsupported fields, a missing symbol
# (nvmlDeviceGetCurrentClocksThrottleReasons), the two-call process lists with
# a "not available" memory value, a versioned struct check and setters that
# change what the getters answer.
FAKE_LIBRARY_C = r"""
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef struct { int index; } gpu_t;
typedef gpu_t *dev;
typedef unsigned long long ull;
typedef struct { unsigned version; ull total, reserved, free, used; } mem2;
typedef struct { ull total, free, used; } mem1;
typedef struct { unsigned gpu, memory; } util;
typedef struct {
    char busIdLegacy[16]; unsigned domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32];
} pci;
typedef struct { unsigned pid; ull usedGpuMemory; unsigned gpuInstanceId, computeInstanceId; } proc;

static gpu_t gpus[2] = {{0}, {1}};
static int inits = 0;
static unsigned power_limit[2] = {450000, 700000};
static unsigned fan_speed[2] = {30, 31};
static unsigned fan_policy[2] = {0, 0};

#define CHECK(d) if (!inits) return 1; if ((d) != &gpus[0] && (d) != &gpus[1]) return 2

static int inits_off_main = 0;  /* starts made on a thread other than the main one */
int nvmlInitWithFlags(unsigned flags) {
    if (flags) return 2;
    const char *delay = getenv("FAKE_NVML_INIT_DELAY_MS");  /* a driver slow to start */
    if (delay) { struct timespec t = {0, atol(delay) * 1000000L}; nanosleep(&t, NULL); }
    if (syscall(SYS_gettid) != getpid()) inits_off_main++;
    inits++;
    const char *marker = getenv("FAKE_NVML_INIT_MARKER");  /* each finished start, one line */
    if (marker) { FILE *f = fopen(marker, "a"); if (f) { fputs("init\n", f); fclose(f); } }
    return 0; }
int fakeInits(void) { return inits; }
int fakeInitsOffMainThread(void) { return inits_off_main; }
int nvmlShutdown(void) { if (!inits) return 1; inits--; return 0; }
const char *nvmlErrorString(int r) { return r == 77 ? "Seventy-seven, says the library" : "Other"; }
int nvmlSystemGetDriverVersion(char *b, unsigned n) {
    if (!inits) return 1; if (n < 80) return 7; strcpy(b, "580.159.04"); return 0; }
int nvmlSystemGetNVMLVersion(char *b, unsigned n) {
    if (!inits) return 1; if (n < 80) return 7; strcpy(b, "13.580.159.04"); return 0; }
int nvmlSystemGetCudaDriverVersion(int *v) { *v = 13000; return 0; }
int nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = 13010; return 0; }
int nvmlDeviceGetCount_v2(unsigned *c) { if (!inits) return 1; *c = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, dev *d) {
    if (!inits) return 1; if (i > 1) return 2; *d = &gpus[i]; return 0; }
int nvmlDeviceGetName(dev d, char *b, unsigned n) {
    CHECK(d); if (n < 96) return 7; strcpy(b, d->index ? "NVIDIA H200" : "NVIDIA GeForce RTX 4090");
    return 0; }
int nvmlDeviceGetUUID(dev d, char *b, unsigned n) {
    CHECK(d); if (n < 96) return 7;
    sprintf(b, "GPU-0000000%d-1111-2222-3333-444444444444", d->index); return 0; }
static void fill_pci(int i, pci *p) {
    memset(p, 0, sizeof *p);
    sprintf(p->busIdLegacy, "0000:%02X:00.0", 0x17 + i);
    p->bus = 0x17 + i; p->pciDeviceId = i ? 0x233510de : 0x268410de;
    p->pciSubSystemId = 0x16f110de + i;
    sprintf(p->busId, "00000000:%02X:00.0", 0x17 + i);
}
int nvmlDeviceGetPciInfo_v3(dev d, pci *p) { CHECK(d); fill_pci(d->index, p); return 0; }
int nvmlDeviceGetClockInfo(dev d, unsigned t, unsigned *v) {
    CHECK(d); if (t > 3) return 2; *v = 1000 + 100 * t + d->index; return 0; }
int nvmlDeviceGetMaxClockInfo(dev d, unsigned t, unsigned *v) {
    CHECK(d); if (t > 3) return 2; *v = 2000 + 100 * t + d->index; return 0; }
int nvmlDeviceGetMemoryInfo(dev d, mem1 *m) {
    CHECK(d); m->total = (d->index ? 141ULL : 24ULL) << 30; m->used = 5ULL << 30;
    m->free = m->total - m->used; return 0; }
int nvmlDeviceGetMemoryInfo_v2(dev d, mem2 *m) {
    CHECK(d); if (m->version != 0x02000028) return 25;
    m->total = (d->index ? 141ULL : 24ULL) << 30; m->reserved = 1ULL << 29; m->used = 4ULL << 30;
    m->free = m->total - m->used - m->reserved; return 0; }
int nvmlDeviceGetUtilizationRates(dev d, util *u) {
    CHECK(d); u->gpu = 87 + d->index; u->memory = 41; return 0; }
int nvmlDeviceGetNumFans(dev d, unsigned *n) { CHECK(d); *n = d->index ? 0 : 2; return 0; }
int nvmlDeviceGetFanSpeed_v2(dev d, unsigned f, unsigned *v) {
    CHECK(d); if (d->index) return 3; if (f > 1) return 2; *v = fan_speed[f]; return 0; }
int nvmlDeviceGetFanControlPolicy_v2(dev d, unsigned f, unsigned *v) {
    CHECK(d); if (d->index) return 3; if (f > 1) return 2; *v = fan_policy[f]; return 0; }
int nvmlDeviceGetMinMaxFanSpeed(dev d, unsigned *lo, unsigned *hi) {
    CHECK(d); if (d->index) return 3; *lo = 30; *hi = 100; return 0; }
int nvmlDeviceGetTemperature(dev d, unsigned s, unsigned *v) {
    CHECK(d); if (s) return 2; *v = 45 + d->index; return 0; }
int nvmlDeviceGetTemperatureThreshold(dev d, unsigned t, unsigned *v) {
    CHECK(d); if (t > 1) return 3; *v = t ? 90 : 95; return 0; }
int nvmlDeviceGetPowerUsage(dev d, unsigned *v) { CHECK(d); *v = 123456 + d->index; return 0; }
int nvmlDeviceGetEnforcedPowerLimit(dev d, unsigned *v) {
    CHECK(d); *v = power_limit[d->index]; return 0; }
int nvmlDeviceGetPowerManagementLimit(dev d, unsigned *v) {
    CHECK(d); *v = power_limit[d->index]; return 0; }
int nvmlDeviceGetPowerManagementDefaultLimit(dev d, unsigned *v) {
    CHECK(d); *v = d->index ? 700000 : 450000; return 0; }
int nvmlDeviceGetPowerManagementLimitConstraints(dev d, unsigned *lo, unsigned *hi) {
    CHECK(d); *lo = d->index ? 200000 : 150000; *hi = d->index ? 700000 : 600000; return 0; }
int nvmlDeviceGetPerformanceState(dev d, unsigned *v) {
    CHECK(d); *v = d->index ? 32 : 2; return 0; }
int nvmlDeviceGetCurrentClocksEventReasons(dev d, ull *v) {
    CHECK(d); *v = d->index ? 0x1ULL : 0x8000000000ULL | 0x4; return 0; }
int nvmlDeviceGetCurrPcieLinkGeneration(dev d, unsigned *v) { CHECK(d); *v = 4; return 0; }
int nvmlDeviceGetCurrPcieLinkWidth(dev d, unsigned *v) { CHECK(d); *v = 16; return 0; }
int nvmlDeviceGetMaxPcieLinkGeneration(dev d, unsigned *v) {
    CHECK(d); *v = d->index ? 5 : 4; return 0; }
int nvmlDeviceGetMaxPcieLinkWidth(dev d, unsigned *v) { CHECK(d); *v = 16; return 0; }
int nvmlDeviceGetTotalEccErrors(dev d, unsigned t, unsigned c, ull *v) {
    CHECK(d); if (!d->index) return 3; *v = 0x100000000ULL + 10 * t + c; return 0; }
static int procs(dev d, unsigned *count, proc *out, int graphics) {
    static const proc table[3] = {
        {4242, 1ULL << 32, 0xFFFFFFFF, 0xFFFFFFFF},
        {4343, 0xFFFFFFFFFFFFFFFFULL, 1, 2},
        {4444, 3ULL << 20, 0, 0}};
    CHECK(d);
    unsigned n = d->index ? 0 : (graphics ? 1 : 3);
    if (*count < n) { *count = n; return 7; }
    for (unsigned i = 0; i < n; i++) out[i] = table[graphics ? 2 : i];
    *count = n; return 0;
}
int nvmlDeviceGetComputeRunningProcesses_v3(dev d, unsigned *c, proc *p) {
    return procs(d, c, p, 0); }
int nvmlDeviceGetComputeRunningProcesses_v2(dev d, unsigned *c, proc *p) {
    return procs(d, c, p, 0); }
int nvmlDeviceGetGraphicsRunningProcesses_v3(dev d, unsigned *c, proc *p) {
    return procs(d, c, p, 1); }
int nvmlDeviceGetGraphicsRunningProcesses_v2(dev d, unsigned *c, proc *p) {
    return procs(d, c, p, 1); }
int nvmlDeviceGetPcieThroughput(dev d, unsigned c, unsigned *v) {
    CHECK(d); if (c > 1) return 2; *v = 1000 * (c + 1) + d->index; return 0; }
int nvmlDeviceGetTotalEnergyConsumption(dev d, ull *v) {
    CHECK(d); *v = 0x123456789ULL + d->index; return 0; }
int nvmlDeviceGetPcieReplayCounter(dev d, unsigned *v) { CHECK(d); *v = 3 * d->index; return 0; }
int nvmlDeviceGetNvLinkState(dev d, unsigned l, unsigned *v) {
    CHECK(d); if (l >= 6) return 2; *v = l < 4; return 0; }
int nvmlDeviceGetNvLinkRemoteDeviceType(dev d, unsigned l, unsigned *v) {
    CHECK(d); if (l >= 6) return 2; *v = l < 2 ? 0 : 2; return 0; }
int nvmlDeviceGetNvLinkRemotePciInfo_v2(dev d, unsigned l, pci *p) {
    CHECK(d); if (l >= 6) return 2; fill_pci(1 - d->index, p); return 0; }
int nvmlDeviceGetTopologyCommonAncestor(dev a, dev b, unsigned *v) {
    CHECK(a); CHECK(b); *v = a == b ? 0 : 20; return 0; }
int nvmlDeviceGetP2PStatus(dev a, dev b, unsigned i, unsigned *v) {
    CHECK(a); CHECK(b); if (i > 5) return 2; *v = i == 0 ? 0 : 2; return 0; }
int nvmlDeviceGetNumaNodeId(dev d, int *v) { CHECK(d); if (d->index) return 3; *v = 1; return 0; }
int nvmlDeviceGetCpuAffinity(dev d, unsigned n, ull *m) {
    CHECK(d);
    for (unsigned i = 0; i < n; i++)
        m[i] = i ? 0x8000000000000001ULL : (d->index ? 0xFFFF0000ULL : 0xFFFFULL);
    return 0; }
int nvmlDeviceSetPowerManagementLimit(dev d, unsigned v) {
    CHECK(d); if (v < 150000 || v > 700000) return 2; power_limit[d->index] = v; return 0; }
int nvmlDeviceSetFanSpeed_v2(dev d, unsigned f, unsigned v) {
    CHECK(d); if (d->index) return 3; if (f > 1 || v > 100) return 2;
    fan_speed[f] = v; fan_policy[f] = 1; return 0; }
int nvmlDeviceSetDefaultFanSpeed_v2(dev d, unsigned f) {
    CHECK(d); if (d->index) return 3; if (f > 1) return 2;
    fan_policy[f] = 0; fan_speed[f] = 30 + f; return 0; }
"""

# Run in a child with the stand-in library first on LD_LIBRARY_PATH: each
# module is asked the same questions and the answers are printed as JSON.
COMPARE_SCRIPT = r"""
import ctypes, json, sys
from concurrent.futures import ThreadPoolExecutor
import pynvml
from gpustation.telemetry import nvml_lite
from gpustation.telemetry.nvml import NvmlBackend
from gpustation.telemetry.sampler import Sampler

def norm(v):
    if isinstance(v, ctypes.Structure):
        return {"struct": {k: norm(getattr(v, k)) for k, *_ in v._fields_}}
    if isinstance(v, ctypes.Array):
        return {"array": [norm(x) for x in v]}
    if isinstance(v, ctypes._Pointer):
        return {"handle": ctypes.cast(v, ctypes.c_void_p).value}
    if isinstance(v, (list, tuple)):
        return {type(v).__name__: [norm(x) for x in v]}
    if type(v).__name__ == "nvmlFriendlyObject":
        return {"object": {k: norm(x) for k, x in vars(v).items()}}
    return [type(v).__name__, v]

def call(mod, name, *args, **kw):
    try:
        return norm(getattr(mod, name)(*args, **kw))
    except mod.NVMLError as e:
        return ["NVMLError", e.value, str(e)]

PER_GPU = [
    "nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo", "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetNumFans",
    "nvmlDeviceGetMinMaxFanSpeed", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementLimit", "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerManagementLimitConstraints", "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses_v2", "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetNumaNodeId",
]

def ask(mod):
    r = {"before_init": call(mod, "nvmlDeviceGetCount")}
    mod.nvmlInit()
    h = [mod.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
    r["handles"] = norm(h)
    r["bad_index"] = call(mod, "nvmlDeviceGetHandleByIndex", 5)
    # Many threads fill the empty function cache at once; every one sees the
    # same answers as the plain calls below.
    with ThreadPoolExecutor(8) as pool:
        runs = list(pool.map(lambda _: [call(mod, n, h[0]) for n in PER_GPU], range(32)))
    threaded = runs[0] if all(run == runs[0] for run in runs) else None
    for n in ["nvmlDeviceGetCount", "nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion",
              "nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2"]:
        r[n] = call(mod, n)
    for i in range(2):
        g = r[f"gpu{i}"] = {n: call(mod, n, h[i]) for n in PER_GPU}
        g["memory_v2"] = call(mod, "nvmlDeviceGetMemoryInfo", h[i], version=mod.nvmlMemory_v2)
        g["memory_v2_wrong_version"] = call(
            mod, "nvmlDeviceGetMemoryInfo", h[i], version=0x02000020)
        for t in (1, 2, 7):
            g[f"clock{t}"] = call(mod, "nvmlDeviceGetClockInfo", h[i], t)
            g[f"max_clock{t}"] = call(mod, "nvmlDeviceGetMaxClockInfo", h[i], t)
        for f in (0, 1, 2):
            g[f"fan{f}"] = call(mod, "nvmlDeviceGetFanSpeed_v2", h[i], f)
            g[f"fan_policy{f}"] = call(mod, "nvmlDeviceGetFanControlPolicy_v2", h[i], f)
        g["temperature"] = call(mod, "nvmlDeviceGetTemperature", h[i], mod.NVML_TEMPERATURE_GPU)
        for t in (0, 1, 2):
            g[f"threshold{t}"] = call(mod, "nvmlDeviceGetTemperatureThreshold", h[i], t)
        g["ecc"] = call(mod, "nvmlDeviceGetTotalEccErrors", h[i], 1, 0)
        for c in (0, 1, 2):
            g[f"pcie{c}"] = call(mod, "nvmlDeviceGetPcieThroughput", h[i], c)
        for link in (0, 2, 4, 7):
            g[f"nvlink{link}"] = call(mod, "nvmlDeviceGetNvLinkState", h[i], link)
            g[f"nvlink_type{link}"] = call(mod, "nvmlDeviceGetNvLinkRemoteDeviceType", h[i], link)
            g[f"nvlink_pci{link}"] = call(mod, "nvmlDeviceGetNvLinkRemotePciInfo", h[i], link)
        g["topology"] = call(mod, "nvmlDeviceGetTopologyCommonAncestor", h[i], h[1 - i])
        for p in (mod.NVML_P2P_CAPS_INDEX_WRITE, 0, 9):
            g[f"p2p{p}"] = call(mod, "nvmlDeviceGetP2PStatus", h[i], h[1 - i], p)
        for words in (1, 2):
            g[f"affinity{words}"] = call(mod, "nvmlDeviceGetCpuAffinity", h[i], words)
    r["error77"] = str(mod.NVMLError(77))
    r["setters"] = [
        call(mod, "nvmlDeviceSetPowerManagementLimit", h[0], 300000),
        call(mod, "nvmlDeviceGetPowerManagementLimit", h[0]),
        call(mod, "nvmlDeviceSetPowerManagementLimit", h[0], 100),
        call(mod, "nvmlDeviceSetPowerManagementLimit", h[0], 450000),
        call(mod, "nvmlDeviceSetFanSpeed_v2", h[0], 1, 77),
        call(mod, "nvmlDeviceGetFanSpeed_v2", h[0], 1),
        call(mod, "nvmlDeviceGetFanControlPolicy_v2", h[0], 1),
        call(mod, "nvmlDeviceSetDefaultFanSpeed_v2", h[0], 1),
        call(mod, "nvmlDeviceGetFanControlPolicy_v2", h[0], 1),
        call(mod, "nvmlDeviceSetFanSpeed_v2", h[1], 0, 50),
    ]
    r["threads_agree"] = threaded == [r["gpu0"][n] for n in PER_GPU]
    mod.nvmlShutdown()
    return r

def snapshot(mod):
    with NvmlBackend(nvml=mod, sysfs_pci_root="/nonexistent") as backend:
        d = Sampler(backend, with_host=False).sample(slow=True).to_dict()
        d.pop("time")
        d["errors"] = sorted(f"{k}: {v}" for k, v in backend.errors.items())
        d["missing_functions"] = sorted(backend.missing_functions)
        return d

out = {"lite": ask(nvml_lite), "pynvml": ask(pynvml)}
out["snapshot_lite"] = snapshot(nvml_lite)
out["snapshot_pynvml"] = snapshot(pynvml)
json.dump(out, sys.stdout)
"""


@pytest.fixture(scope="module")
def fake_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the stand-in libnvidia-ml.so.1 (skips without a C compiler)."""
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None or not sys.platform.startswith("linux"):
        pytest.skip("needs a C compiler on Linux to build a stand-in libnvidia-ml.so.1")
    where = tmp_path_factory.mktemp("fake-libnvidia-ml")
    source = where / "fake_nvml.c"
    source.write_text(FAKE_LIBRARY_C)
    # No soname: a library loaded by path must never satisfy a later
    # dlopen("libnvidia-ml.so.1") elsewhere in the same process.
    result = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", "-o", str(where / "libnvidia-ml.so.1"), str(source)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return where


def _env_with_library(library: Path, **extra: str) -> dict[str, str]:
    env = child_env(LD_LIBRARY_PATH=str(library), **extra)
    if "GPUSTATION_NVML" not in extra:
        env.pop("GPUSTATION_NVML", None)
    return env


@pytest.fixture(scope="module")
def answers(fake_library: Path) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", COMPARE_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env_with_library(fake_library),
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            line
            for key in sorted(set(a) | set(b))
            for line in _differences(a.get(key), b.get(key), f"{path}/{key}")
        ]
    return [] if a == b else [f"{path}: pynvml {a!r} != lite {b!r}"]


def test_every_call_answers_as_pynvml_does(answers: dict[str, Any]) -> None:
    assert _differences(answers["pynvml"], answers["lite"]) == []


def test_the_stand_in_library_was_really_read(answers: dict[str, Any]) -> None:
    # The comparison above means something only if real values came through.
    lite = answers["lite"]
    h200, rtx = lite["gpu1"], lite["gpu0"]
    assert lite["before_init"] == ["NVMLError", 1, "Uninitialized"]
    assert lite["nvmlSystemGetDriverVersion"] == ["str", "580.159.04"]
    assert h200["nvmlDeviceGetName"] == ["str", "NVIDIA H200"]
    assert h200["nvmlDeviceGetPciInfo"]["struct"]["busId"] == ["str", "00000000:18:00.0"]
    assert h200["memory_v2"]["struct"]["version"] == ["int", nvml_lite.nvmlMemory_v2]
    assert h200["memory_v2"]["struct"]["reserved"] == ["int", 1 << 29]
    assert h200["memory_v2_wrong_version"][:2] == ["NVMLError", 25]
    assert h200["ecc"] == ["int", (1 << 32) + 10]  # 64-bit answer, not truncated
    assert h200["nvmlDeviceGetTotalEnergyConsumption"] == ["int", 0x12345678A]
    assert h200["fan0"][:2] == ["NVMLError", nvml_lite.NVML_ERROR_NOT_SUPPORTED]
    assert rtx["nvmlDeviceGetMinMaxFanSpeed"] == {"list": [["int", 30], ["int", 100]]}
    assert rtx["nvmlDeviceGetCurrentClocksThrottleReasons"] == [
        "NVMLError",
        nvml_lite.NVML_ERROR_FUNCTION_NOT_FOUND,
        "Function Not Found",
    ]
    procs = rtx["nvmlDeviceGetComputeRunningProcesses_v3"]["list"]
    assert [p["object"]["pid"] for p in procs] == [["int", 4242], ["int", 4343], ["int", 4444]]
    assert procs[1]["object"]["usedGpuMemory"] == ["NoneType", None]
    assert procs[0]["object"]["usedGpuMemory"] == ["int", 1 << 32]
    assert h200["nvmlDeviceGetComputeRunningProcesses_v3"] == {"list": []}
    assert rtx["affinity2"]["array"] == [["int", 0xFFFF], ["int", 0x8000000000000001]]
    assert lite["error77"] == "Seventy-seven, says the library"
    assert lite["setters"][1] == ["int", 300000]
    assert lite["setters"][2][:2] == ["NVMLError", nvml_lite.NVML_ERROR_INVALID_ARGUMENT]
    assert lite["setters"][5:7] == [["int", 77], ["int", 1]]
    assert lite["threads_agree"] is True


def test_backend_snapshots_agree_on_both_bindings(answers: dict[str, Any]) -> None:
    lite, theirs = answers["snapshot_lite"], answers["snapshot_pynvml"]
    assert _differences(theirs, lite) == []
    assert [g["name"] for g in lite["gpus"]] == ["NVIDIA GeForce RTX 4090", "NVIDIA H200"]
    assert lite["gpus"][1]["memory_total_mib"] == 141 * 1024
    assert lite["topology"]["links"][0]["level"] == "NV2"
    assert lite["missing_functions"] == ["nvmlDeviceGetNvLinkRemotePciInfo_v2"]


def test_default_binding_is_lite_and_pynvml_is_not_imported(fake_library: Path) -> None:
    code = (
        "import sys; from gpustation.telemetry.nvml import NvmlBackend\n"
        "with NvmlBackend() as b:\n"
        "    print(b.nvml.__name__, 'pynvml' in sys.modules, b.device_count())"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env_with_library(fake_library),
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["gpustation.telemetry.nvml_lite", "False", "2"]
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env_with_library(fake_library, GPUSTATION_NVML="pynvml"),
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["pynvml", "True", "2"]


def test_cli_snapshot_is_the_same_through_either_binding(fake_library: Path) -> None:
    def snapshot(**extra: str) -> dict[str, Any]:
        run = subprocess.run(
            gpustation_cmd("snapshot", "--json"),
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            env=_env_with_library(fake_library, **extra),
        )
        assert run.returncode == 0, run.stderr
        doc = json.loads(run.stdout)
        for gpu in doc["gpus"]:
            for proc in gpu["processes"]:  # pids of the stand-in may exist here
                proc.update(user=None, name=None, command=None)
        return {k: doc[k] for k in ("gpus", "topology", "driver_version", "cuda_driver_version")}

    lite = snapshot()
    assert [g["uuid"] for g in lite["gpus"]] == [
        "GPU-00000000-1111-2222-3333-444444444444",
        "GPU-00000001-1111-2222-3333-444444444444",
    ]
    assert lite["cuda_driver_version"] == "13.1"
    assert _differences(snapshot(GPUSTATION_NVML="pynvml"), lite) == []


def test_snapshot_starts_nvml_early_on_a_thread_of_its_own(fake_library: Path) -> None:
    # `gpustation snapshot` starts the driver while it imports and parses its
    # arguments; the backend's own start waits for that one. Not for simulated
    # GPUs, other hosts or nvidia-ml-py.
    code = (
        "import contextlib, ctypes, io, sys\n"
        "from gpustation.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    rc = main(sys.argv[1:])\n"
        "lib = ctypes.CDLL('libnvidia-ml.so.1')\n"
        "print(rc, lib.fakeInits(), lib.fakeInitsOffMainThread(), 'H200' in out.getvalue())"
    )

    def run(*args: str, **env: str) -> list[str]:
        result = subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=_env_with_library(fake_library, **env),
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.split()

    assert run("snapshot") == ["0", "2", "1", "True"]  # early + the backend's own
    assert run("snapshot", "--json") == ["0", "2", "1", "True"]
    assert run("snapshot", "--simulate", "1") == ["0", "0", "0", "False"]
    assert run("snapshot", GPUSTATION_NVML="pynvml") == ["0", "1", "0", "True"]
    # other commands start NVML when they open it (and shut it down when done)
    assert run("power", "show") == ["0", "0", "0", "True"]


def test_snapshot_never_exits_while_the_early_start_runs(
    fake_library: Path, tmp_path: Path
) -> None:
    # A usage error ends the command long before a slow driver has started on
    # the early thread: the process waits for that start to finish rather
    # than tear the library down under it.
    marker = tmp_path / "inits"
    result = subprocess.run(
        gpustation_cmd("snapshot", "--no-such-option"),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env=_env_with_library(
            fake_library, FAKE_NVML_INIT_DELAY_MS="400", FAKE_NVML_INIT_MARKER=str(marker)
        ),
    )
    assert result.returncode == EXIT_USAGE, result.stderr
    assert "--no-such-option" in result.stderr
    assert marker.read_text() == "init\n"  # the early start ran to its end


def test_snapshot_leaves_without_the_teardowns_once_its_output_is_out(
    fake_library: Path, tmp_path: Path
) -> None:
    # `gpustation snapshot` of this machine's GPUs skips the interpreter's and
    # the NVML library's teardown (os._exit), but only after its output is
    # flushed and its backend closed; other commands exit normally.
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: sys.stderr.write('teardown ran\\n'))\n"
        "from gpustation.cli import console\n"
        "console()\n"
    )

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=_env_with_library(fake_library, XDG_STATE_HOME=str(tmp_path), **env),
        )

    table = run("snapshot")
    assert table.returncode == 0, table.stderr
    assert "teardown ran" not in table.stderr
    assert "H200" in table.stdout and table.stdout.rstrip().splitlines()[-1].strip()
    doc = run("snapshot", "--json")  # a whole document, though stdout is a pipe
    assert doc.returncode == 0 and "teardown ran" not in doc.stderr
    assert len(json.loads(doc.stdout)["gpus"]) == 2
    assert list(tmp_path.rglob("nvml-static.marshal"))  # the cache was written first
    bad = run("snapshot", "--gpus", "7")
    assert bad.returncode == EXIT_USAGE
    assert "no GPU 7" in bad.stderr and "teardown ran" not in bad.stderr
    for args in (("snapshot", "--simulate", "1"), ("power", "show")):
        normal = run(*args)
        assert normal.returncode == 0, normal.stderr
        assert "teardown ran" in normal.stderr


@pytest.fixture
def lite_on_fake_library(
    fake_library: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ModuleType]:
    """The lite binding loaded in this process from the stand-in, by path."""
    monkeypatch.setattr(nvml_lite, "_LIBRARY_NAMES", (str(fake_library / "libnvidia-ml.so.1"),))
    monkeypatch.setattr(nvml_lite, "_lib", None)
    monkeypatch.setattr(nvml_lite, "_fns", {})
    monkeypatch.setattr(nvml_lite, "_refcount", 0)
    yield nvml_lite


def test_function_pointers_are_looked_up_once(lite_on_fake_library: ModuleType) -> None:
    lite = lite_on_fake_library
    lite.nvmlInit()
    handle = lite.nvmlDeviceGetHandleByIndex(0)
    lite.nvmlDeviceGetPowerUsage(handle)
    cached = lite._fns["nvmlDeviceGetPowerUsage"]
    assert lite.nvmlDeviceGetPowerUsage(handle) == 123456
    assert lite._fns["nvmlDeviceGetPowerUsage"] is cached
    with pytest.raises(lite.NVMLError) as info:
        lite.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
    assert info.value.value == lite.NVML_ERROR_FUNCTION_NOT_FOUND
    assert lite._refcount == 1
    lite.nvmlShutdown()
    assert lite._refcount == 0


def test_no_shared_default_between_calls(lite_on_fake_library: ModuleType) -> None:
    # pynvml fills one default c_uint for every nvmlDeviceGetMinMaxFanSpeed
    # call; the lite binding gives each call its own, so answers never alias.
    lite = lite_on_fake_library
    lite.nvmlInit()
    try:
        handle = lite.nvmlDeviceGetHandleByIndex(0)
        first = lite.nvmlDeviceGetMinMaxFanSpeed(handle)
        assert first == [30, 100]
        lo, hi = ctypes.c_uint(), ctypes.c_uint()
        ret = lite.nvmlDeviceGetMinMaxFanSpeed(handle, ctypes.byref(lo), ctypes.byref(hi))
        assert ret == lite.NVML_SUCCESS and (lo.value, hi.value) == (30, 100)
        policy = ctypes.c_uint(99)
        assert lite.nvmlDeviceGetFanControlPolicy_v2(handle, 0, ctypes.byref(policy)) == 0
        assert policy.value == 0
    finally:
        lite.nvmlShutdown()
