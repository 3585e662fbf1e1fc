"""The Prometheus endpoint: names, labels and units, values, cadence, serving."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpustation import cli
from gpustation.control.journal import active_profile
from gpustation.errors import EXIT_USAGE, UsageError
from gpustation.runs.store.index import RunStore, runs_by_status
from gpustation.runs.summary import RunSummary
from gpustation.serve.exporter import (
    GPU_LABELS,
    Exporter,
    is_loopback,
    parse_listen,
)
from gpustation.serve.http import serve
from gpustation.telemetry.model import THROTTLE_REASONS, Snapshot, encode_throttle
from gpustation.telemetry.sampler import Sampler
from gpustation.telemetry.sim import SimBackend
from tests.conftest import child_env, gpustation_cmd, known
from tests.fleet.sshd import free_port
from tests.tools import tool

FROZEN = 1e6
DCGM = {
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
}


def _frozen(count: int = 2, card: str = "rtx4090") -> tuple[SimBackend, Sampler]:
    backend = SimBackend(count=count, card=card, state_path=None, clock=lambda: FROZEN)
    return backend, Sampler(backend, with_host=False, clock=lambda: FROZEN)


def _scrape(exporter: Exporter) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """name -> {sorted label pairs -> value}, through the text format and its parser."""
    text = generate_latest(exporter.registry).decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _gpu_series(
    series: dict[tuple[tuple[str, str], ...], float], gpu: int, **extra: str
) -> float | None:
    for labels, value in series.items():
        d = dict(labels)
        if d.get("gpu") == str(gpu) and all(d.get(k) == v for k, v in extra.items()):
            return value
    return None


def test_values_match_the_snapshot_exactly() -> None:
    backend, sampler = _frozen()
    backend.poke(1, load=1.0)  # busy and power-capped: throttle reasons, processes
    backend.poke(0, load=0.0)  # idle: the video engines read 0, which is still exported
    exporter = Exporter(sampler.sample, with_extras=False)
    exporter.sample_once()
    m = _scrape(exporter)
    snap = sampler.sample()  # the frozen clock makes this the same moment
    assert set(m) >= DCGM
    for gpu in snap.gpus:
        i = gpu.index
        labels = dict(next(k for k in m["DCGM_FI_DEV_GPU_TEMP"] if dict(k)["gpu"] == str(i)))
        assert labels == {
            "gpu": str(i),
            "UUID": gpu.uuid,
            "pci_bus_id": gpu.pci_bus_id,
            "modelName": gpu.name,
            "hostname": snap.hostname,
        }
        assert _gpu_series(m["DCGM_FI_DEV_GPU_TEMP"], i) == gpu.temperature_c
        assert _gpu_series(m["DCGM_FI_DEV_POWER_USAGE"], i) == gpu.power_w
        assert _gpu_series(m["DCGM_FI_DEV_SM_CLOCK"], i) == gpu.clock_sm_mhz
        assert _gpu_series(m["DCGM_FI_DEV_MEM_CLOCK"], i) == gpu.clock_mem_mhz
        assert _gpu_series(m["DCGM_FI_DEV_FB_USED"], i) == gpu.memory_used_mib
        assert gpu.memory_total_mib is not None and gpu.memory_used_mib is not None
        assert (
            _gpu_series(m["DCGM_FI_DEV_FB_FREE"], i) == gpu.memory_total_mib - gpu.memory_used_mib
        )
        assert _gpu_series(m["DCGM_FI_DEV_GPU_UTIL"], i) == gpu.utilization_gpu_pct
        assert _gpu_series(m["DCGM_FI_DEV_ENC_UTIL"], i) == gpu.encoder_utilization_pct
        assert _gpu_series(m["DCGM_FI_DEV_DEC_UTIL"], i) == gpu.decoder_utilization_pct
        assert gpu.energy_j is not None and gpu.throttle_reasons is not None
        assert _gpu_series(m["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"], i) == pytest.approx(
            gpu.energy_j * 1000.0
        )
        assert _gpu_series(m["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"], i) == gpu.pcie.replay_errors
        assert _gpu_series(m["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"], i) == encode_throttle(
            gpu.throttle_reasons
        )
        assert _gpu_series(m["gpustation_power_limit_watts"], i) == gpu.power_limit_w
        assert _gpu_series(m["gpustation_pcie_link_gen"], i) == gpu.pcie.gen
        assert _gpu_series(m["gpustation_pcie_link_width"], i) == gpu.pcie.width
        for fan, pct in enumerate(gpu.fans_pct):
            assert _gpu_series(m["gpustation_fan_speed_percent"], i, fan=str(fan)) == pct
        for _, reason in THROTTLE_REASONS:
            want = 1.0 if reason in gpu.throttle_reasons else 0.0
            assert _gpu_series(m["gpustation_throttle_reason"], i, reason=reason) == want
    busy = snap.gpus[1]
    assert busy.decoder_utilization_pct and snap.gpus[0].decoder_utilization_pct == 0
    assert _gpu_series(m["DCGM_FI_DEV_DEC_UTIL"], 0) == 0.0
    assert busy.throttle_reasons is not None
    assert "sw_power_cap" in busy.throttle_reasons  # the check above covered a live reason
    assert _gpu_series(m["gpustation_throttle_reason"], 1, reason="sw_power_cap") == 1.0
    assert m["gpustation_simulated"][()] == 1.0
    assert m["gpustation_snapshot_timestamp_seconds"][()] == FROZEN
    assert m["gpustation_up"][()] == 1.0


def test_missing_values_are_omitted_not_zero() -> None:
    backend, sampler = _frozen(count=3, card="h200")  # datacenter card: no fans
    backend.poke(0, temperature_fails=True)
    backend.poke(1, lost=True)
    exporter = Exporter(sampler.sample, with_extras=False)
    exporter.sample_once()
    m = _scrape(exporter)
    assert [dict(k)["gpu"] for k in m["DCGM_FI_DEV_GPU_TEMP"]] == ["2"]  # 0 unread, 1 lost
    assert sorted(dict(k)["gpu"] for k in m["DCGM_FI_DEV_POWER_USAGE"]) == ["0", "2"]
    assert "gpustation_fan_speed_percent" not in m
    assert _gpu_series(m["gpustation_gpu_lost"], 1) == 1.0
    assert _gpu_series(m["gpustation_gpu_lost"], 0) == 0.0


def test_scrapes_never_sample_and_failures_keep_the_last_values() -> None:
    calls = []
    _, sampler = _frozen()

    def sample() -> Snapshot:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("driver hiccup")
        return sampler.sample()

    exporter = Exporter(sample, with_extras=False)
    exporter.sample_once()
    for _ in range(20):
        _scrape(exporter)
    assert len(calls) == 1
    exporter.sample_once()  # fails
    m = _scrape(exporter)
    assert m["gpustation_up"][()] == 0.0
    assert "DCGM_FI_DEV_GPU_TEMP" in m  # last good values still served


def test_a_stuck_scraper_does_not_stall_sampling_or_other_scrapers() -> None:
    _, sampler = _frozen()
    exporter = Exporter(sampler.sample, interval_s=0.1, with_extras=False)
    server, _ = serve(exporter, "127.0.0.1", 0)
    port = server.server_address[1]
    stuck = socket.create_connection(("127.0.0.1", port))
    try:
        exporter.start()
        stuck.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finishes its request
        before = exporter.samples_taken
        deadline = time.monotonic() + 30
        while exporter.samples_taken < before + 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert exporter.samples_taken >= before + 5
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
            assert b"DCGM_FI_DEV_GPU_TEMP" in resp.read()
    finally:
        stuck.close()
        exporter.stop()
        server.shutdown()
        server.server_close()


def test_active_profile_from_the_control_journal(gpustation_dirs: dict[str, Path]) -> None:
    journal = gpustation_dirs["state"] / "control-journal.jsonl"
    assert active_profile() is None
    entry = {"what": "power_limit", "gpu": 0, "command": "gpustation profile apply quiet --gpus 0"}
    journal.write_text(json.dumps(entry) + "\n" + '{"torn": ')
    assert active_profile() == "quiet"
    manual = {"what": "power_limit", "gpu": 0, "command": "gpustation power set 300"}
    with journal.open("a") as fh:
        fh.write("\n" + json.dumps(manual) + "\n")
    assert active_profile() is None


def test_runs_by_status_from_the_run_store() -> None:
    assert runs_by_status() == {}
    store = RunStore()
    for i, status in enumerate(["finished", "finished", "failed", "running"]):
        store.upsert(RunSummary(id=f"run-{i}", status=status, started_at=float(i)))
    assert runs_by_status() == {"finished": 2, "failed": 1, "running": 1}
    _, sampler = _frozen()
    exporter = Exporter(sampler.sample)
    exporter._refresh_extras()
    exporter.sample_once()
    m = _scrape(exporter)
    assert m["gpustation_runs"][(("status", "finished"),)] == 2.0
    assert "gpustation_hardware_profile" not in m


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("127.0.0.1:9400", ("127.0.0.1", 9400)),
        ("[::1]:9500", ("::1", 9500)),
        (":9400", ("0.0.0.0", 9400)),
        ("box.lan:80", ("box.lan", 80)),
    ],
)
def test_parse_listen(text: str, want: tuple[str, int]) -> None:
    assert parse_listen(text) == want


@pytest.mark.parametrize("text", ["9400", "host:", "host:0", "host:70000", "::1:9400", "[x]:1"])
def test_parse_listen_refuses(text: str) -> None:
    with pytest.raises(UsageError):
        parse_listen(text)


def test_loopback_detection() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")


def test_serve_bad_listen_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--simulate", "1", "--listen", "nowhere"]) == EXIT_USAGE
    assert "--listen" in capsys.readouterr().err


def test_serve_port_in_use_names_the_port(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = cli.main(["serve", "--simulate", "1", "--listen", f"127.0.0.1:{port}"])
    err = capsys.readouterr().err
    assert code == 1
    assert f"127.0.0.1:{port}" in err and "already in use" in err


# ---- the real command, over loopback --------------------------------------------


def _start_serve(listen: str, tmp_path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        gpustation_cmd("serve", "--simulate", "2", "--interval", "0.2", "--listen", listen),
        env=child_env(GPUSTATION_STATE_DIR=str(tmp_path)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _fetch(port: int, proc: subprocess.Popen[str], timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(
                f"serve exited with {proc.returncode}: {proc.stderr and proc.stderr.read()}"
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
                text: str = resp.read().decode()
                return text
        except OSError:
            time.sleep(0.1)
    pytest.fail("no /metrics within the timeout")


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
    return proc.stderr.read() if proc.stderr else ""


# promtool lints names and labels against Prometheus' own conventions. dcgm-exporter's
# names break two of them (camelCase labels modelName/UUID, "COUNTER" in a name);
# gpustation keeps those names on purpose so existing dashboards work.
DCGM_LINTS = (
    "label names should be written in 'snake_case' not 'camelCase'",
    "metric name should not include type 'counter'",
)


def test_metrics_over_loopback_pass_promtool_and_the_parser(tmp_path: Path) -> None:
    port = free_port()
    proc = _start_serve(f"127.0.0.1:{port}", tmp_path)
    try:
        text = _fetch(port, proc)
        snap_proc = subprocess.run(
            gpustation_cmd("snapshot", "--json", "--simulate", "2"),
            env=child_env(GPUSTATION_STATE_DIR=str(tmp_path)),
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        stderr = _stop(proc)
    assert proc.returncode == 0, stderr
    assert "serving http://127.0.0.1:" in stderr and "warning" not in stderr
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) >= DCGM
    for name in DCGM:
        for sample in families[name].samples:
            assert set(sample.labels) == set(GPU_LABELS)
    # plausibility against a snapshot of the same simulated machine
    snap = Snapshot.from_dict(json.loads(snap_proc.stdout))
    temp = families["DCGM_FI_DEV_GPU_TEMP"].samples
    assert sorted(s.labels["UUID"] for s in temp) == sorted(str(g.uuid) for g in snap.gpus)
    for g in snap.gpus:
        power = next(
            s.value
            for s in families["DCGM_FI_DEV_POWER_USAGE"].samples
            if s.labels["gpu"] == str(g.index)
        )
        assert g.power_limit_w is not None and 0 < power <= g.power_limit_w
        limit = next(
            s.value
            for s in families["gpustation_power_limit_watts"].samples
            if s.labels["gpu"] == str(g.index)
        )
        assert limit == g.power_limit_w
    promtool = tool("promtool", "Debian: prometheus")
    check = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    problems = [
        line
        for line in (check.stdout + check.stderr).splitlines()
        if line.strip() and not any(lint in line for lint in DCGM_LINTS)
    ]
    assert check.returncode in (0, 3), check.stderr  # 1 would mean it did not parse
    assert problems == []


def test_non_loopback_listen_warns(tmp_path: Path) -> None:
    port = free_port()
    proc = _start_serve(f"0.0.0.0:{port}", tmp_path)
    try:
        _fetch(port, proc)
    finally:
        stderr = _stop(proc)
    assert f"listening on 0.0.0.0:{port}, which is not a loopback address" in stderr
    assert "without TLS and authentication" in stderr


def test_each_sample_is_rendered_once_however_many_scrape_it() -> None:
    from prometheus_client.exposition import generate_latest

    _, sampler = _frozen()
    exporter = Exporter(sampler.sample, interval_s=60, with_extras=False)
    exporter.sample_once()
    calls: list[int] = []

    def counting(registry: object) -> bytes:
        calls.append(1)
        return generate_latest(registry)  # type: ignore[arg-type]

    first = exporter.rendered(counting)
    assert exporter.rendered(counting) is first and len(calls) == 1
    exporter.sample_once()  # a new sample: rendered anew
    assert exporter.rendered(counting) is not first and len(calls) == 2


def test_twenty_scrapers_at_once_all_get_the_whole_document() -> None:
    import concurrent.futures
    import gzip

    _, sampler = _frozen()
    exporter = Exporter(sampler.sample, interval_s=0.2, with_extras=False)
    exporter.start()
    server, _ = serve(exporter, "127.0.0.1", 0)
    port = server.server_address[1]

    def scrape(i: int) -> bytes:
        headers = {"Accept-Encoding": "gzip"} if i % 2 else {}
        req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
        with urllib.request.urlopen(req, timeout=60) as resp:
            body = resp.read()
            return gzip.decompress(body) if resp.headers.get("Content-Encoding") else body

    try:
        with concurrent.futures.ThreadPoolExecutor(20) as pool:
            bodies = list(pool.map(scrape, range(40)))
    finally:
        exporter.stop()
        server.shutdown()
        server.server_close()
    for body in bodies:
        families = {f.name for f in text_string_to_metric_families(body.decode())}
        assert {"DCGM_FI_DEV_GPU_TEMP", "gpustation_up"} <= families


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    openssl = tool("openssl", "Debian: openssl")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def _serve_with(tmp_path: Path, **kwargs: object) -> tuple[Any, Exporter]:
    _, sampler = _frozen()
    exporter = Exporter(sampler.sample, interval_s=60, with_extras=False)
    exporter.sample_once()
    server, _ = serve(exporter, "127.0.0.1", 0, **kwargs)  # type: ignore[arg-type]
    return server, exporter


def test_tls_serves_https_and_refuses_plain_http(tmp_path: Path) -> None:
    import ssl

    from gpustation.serve.http import tls_context

    cert, key = _self_signed(tmp_path)
    server, _ = _serve_with(tmp_path, tls=tls_context(cert, key))
    port = server.server_address[1]
    try:
        trust = ssl.create_default_context(cafile=str(cert))
        with urllib.request.urlopen(
            f"https://127.0.0.1:{port}/metrics", context=trust, timeout=30
        ) as r:
            assert b"DCGM_FI_DEV_GPU_TEMP" in r.read()
        with pytest.raises((OSError, http.client.HTTPException)):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read()
    finally:
        server.shutdown()
        server.server_close()


def test_basic_auth_refuses_a_bad_password_and_no_password(tmp_path: Path) -> None:
    import base64

    from gpustation.serve.http import load_users

    users_file = tmp_path / "users"
    users_file.write_text("# who may scrape\nprom:s3cret\n")
    users_file.chmod(0o600)
    server, _ = _serve_with(tmp_path, users=load_users(users_file))
    port = server.server_address[1]

    def get(auth: str | None) -> int:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
        if auth is not None:
            req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                assert b"DCGM_FI_DEV_GPU_TEMP" in resp.read()
                return int(resp.status)
        except urllib.error.HTTPError as err:
            assert err.headers.get("WWW-Authenticate", "").startswith("Basic")
            return int(err.code)

    try:
        assert get(None) == 401
        assert get("prom:wrong") == 401
        assert get("nobody:s3cret") == 401
        assert get("prom:s3cret") == 200
    finally:
        server.shutdown()
        server.server_close()


def test_a_readable_auth_file_or_half_a_tls_pair_is_refused(tmp_path: Path) -> None:
    users_file = tmp_path / "users"
    users_file.write_text("prom:s3cret\n")
    users_file.chmod(0o644)
    for argv, named in (
        (("--basic-auth-file", str(users_file)), "chmod 600"),
        (("--tls-cert", str(tmp_path / "c.pem")), "--tls-key"),
    ):
        result = subprocess.run(
            gpustation_cmd("serve", "--simulate", "1", *argv),
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == EXIT_USAGE and named in result.stderr


def test_profiling_xid_nvlink_and_row_remap_series_follow_dcgm() -> None:
    backend, sampler = _frozen(count=2, card="h200")
    backend.read_gpm = True
    backend.poke(0, load=1.0)
    backend.poke(1, load=0.0)
    backend.poke(0, xid=13)
    backend.poke(0, xid=79)
    exporter = Exporter(sampler.sample, with_extras=False)
    exporter.sample_once()
    m = _scrape(exporter)
    snap = sampler.sample()
    busy, idle = snap.gpus
    # DCGM's profiling fields are ratios, the model's percentages.
    for name, pct in (
        ("DCGM_FI_PROF_SM_ACTIVE", busy.sm_active_pct),
        ("DCGM_FI_PROF_SM_OCCUPANCY", busy.sm_occupancy_pct),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", busy.tensor_active_pct),
        ("DCGM_FI_PROF_DRAM_ACTIVE", busy.dram_active_pct),
    ):
        assert pct is not None and pct > 0
        assert _gpu_series(m[name], 0) == pytest.approx(pct / 100.0)
        assert _gpu_series(m[name], 1) == 0.0  # idle is a value, not a gap
    assert _gpu_series(m["DCGM_FI_DEV_XID_ERRORS"], 0) == 79.0  # the last one
    assert _gpu_series(m["DCGM_FI_DEV_XID_ERRORS"], 1) == 0.0
    assert busy.nvlink is not None
    total_kib = sum((x.tx_kib_s or 0.0) + (x.rx_kib_s or 0.0) for x in busy.nvlink)
    assert _gpu_series(m["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"], 0) == pytest.approx(
        total_kib * 1024 / 1e6
    )
    assert _gpu_series(m["DCGM_FI_DEV_ROW_REMAP_PENDING"], 0) == 0.0
    assert _gpu_series(m["DCGM_FI_DEV_ROW_REMAP_FAILURE"], 0) == 0.0
    assert _gpu_series(m["gpustation_mig_enabled"], 0) == 0.0
    assert idle.tensor_active_pct == 0.0


def test_profiling_series_are_left_out_where_the_card_has_no_gpm() -> None:
    backend, sampler = _frozen(count=1, card="rtx4090")
    backend.read_gpm = True
    exporter = Exporter(sampler.sample, with_extras=False)
    exporter.sample_once()
    m = _scrape(exporter)
    for name in (
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "gpustation_mig_enabled",
    ):
        assert name not in m, name
    assert _gpu_series(m["DCGM_FI_DEV_XID_ERRORS"], 0) == 0.0


def test_the_nvlink_total_sums_the_active_links_or_is_the_sum_read_back() -> None:
    backend, sampler = _frozen(count=2, card="h200")
    backend.poke(0, load=1.0)
    snap = sampler.sample()
    links = snap.gpus[0].nvlink
    assert links is not None and len(links) == 18 and links[0].tx_kib_s
    links[1].active = False  # a link down carries nothing
    # a card read back from Prometheus: the sum alone, no links
    snap.gpus[1].nvlink, snap.gpus[1].nvlink_sum_mb_s = None, 123.5
    exporter = Exporter(lambda: snap, with_extras=False)
    exporter.sample_once()
    m = _scrape(exporter)
    total = sum(known(x.tx_kib_s) + known(x.rx_kib_s) for x in links if x.active) * 1024 / 1e6
    assert _gpu_series(m["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"], 0) == pytest.approx(total)
    assert _gpu_series(m["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"], 1) == 123.5


def test_active_alerts_are_exported_a_gpu_held_idle_among_them(tmp_path: Path) -> None:
    from gpustation.telemetry.model import GpuSample, ProcessInfo

    clock = [0.0]

    def sample() -> Snapshot:
        gpu = GpuSample(
            index=0,
            utilization_gpu_pct=0.0,
            memory_used_mib=9000.0,
            memory_total_mib=24000.0,
            processes=[ProcessInfo(pid=7, gpu_memory_mib=8192.0, user="bob", command="jupyter")],
        )
        return Snapshot(hostname="h", time=clock[0], gpus=[gpu])

    exporter = Exporter(sample, interval_s=60, with_extras=False)
    exporter.sample_once()
    first = _scrape(exporter)
    assert "gpustation_alert" not in first or not first["gpustation_alert"]
    clock[0] = 11 * 60.0  # held idle past the default ten minutes
    exporter.sample_once()
    metrics = _scrape(exporter)
    rules = {labels for labels in metrics["gpustation_alert"]}
    assert any(("rule", "gpu_idle_held") in labels for labels in rules)


def test_a_card_that_reports_nothing_exports_no_value_but_its_presence() -> None:
    """Every series derived from a reading is left out when the card does not
    report it: none may stand in a 0 (a slip in any one reader fails here)."""
    from gpustation.telemetry.model import GpuSample

    silent = GpuSample(index=0, name="NVIDIA Silent", uuid="GPU-0", pci_bus_id="0000:01:00.0")
    for field in ("fans_pct", "fan_control", "processes", "nvlink"):
        assert not getattr(silent, field), field  # nothing read: empty, as a backend gives it
    snap = Snapshot(hostname="h", time=FROZEN, gpus=[silent])
    exporter = Exporter(lambda: snap, with_extras=False)
    exporter.sample_once()
    m = _scrape(exporter)
    per_gpu = {name for name, series in m.items() if any(dict(k).get("gpu") == "0" for k in series)}
    # presence, and the process list (the model holds it as a list: empty is none)
    kept = {"gpustation_gpu_lost", "gpustation_gpu_processes"}
    assert per_gpu == kept, per_gpu - kept
    assert _gpu_series(m["gpustation_gpu_lost"], 0) == 0.0


def test_a_missing_tls_file_is_named_with_its_option(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    missing = tmp_path / "missing.pem"
    for argv, named in (
        (("--tls-cert", str(missing), "--tls-key", str(key)), f"--tls-cert {missing}"),
        (("--tls-cert", str(cert), "--tls-key", str(missing)), f"--tls-key {missing}"),
    ):
        result = subprocess.run(
            gpustation_cmd("serve", "--simulate", "1", *argv),
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == EXIT_USAGE, result.stderr
        assert named in result.stderr and "No such file" in result.stderr
        assert "None" not in result.stderr


def test_memory_temperature_follows_dcgm_and_is_left_out_on_gddr_cards() -> None:
    backend, sampler = _frozen(count=2, card="h200")
    backend.poke(0, load=1.0)
    exporter = Exporter(sampler.sample, with_extras=False)
    exporter.sample_once()
    m = _scrape(exporter)
    snap = sampler.sample()
    for gpu in snap.gpus:
        assert gpu.memory_temperature_c is not None
        assert _gpu_series(m["DCGM_FI_DEV_MEMORY_TEMP"], gpu.index) == gpu.memory_temperature_c
        assert _gpu_series(m["gpustation_memory_temperature_max_celsius"], gpu.index) == 95.0
        assert (
            _gpu_series(m["gpustation_temperature_margin_celsius"], gpu.index)
            == gpu.temperature_margin_c
        )
    _, gddr = _frozen(count=1, card="rtx4090")
    exporter = Exporter(gddr.sample, with_extras=False)
    exporter.sample_once()
    m = _scrape(exporter)
    assert "DCGM_FI_DEV_MEMORY_TEMP" not in m
    assert "gpustation_memory_temperature_max_celsius" not in m
