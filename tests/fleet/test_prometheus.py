"""The fleet read from a real Prometheus (Debian's /usr/bin/prometheus) on loopback.

One Prometheus for the module scrapes, every second, three ``gpustation serve
--simulate`` exporters (one of them killed by the stale-host test) and a
recording of dcgm-exporter on an 8-GPU H100 host served by a tiny HTTP
thread. Tests without a Prometheus server cover the series-to-model mapping,
the URL checks, the credentials and the config keys.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpustation import cli
from gpustation.errors import EXIT_UNREACHABLE, EXIT_USAGE, UsageError
from gpustation.fleet.fleet import FleetConfig, fleet_document, load_fleet_config, row_cells
from gpustation.fleet.prometheus import (
    PrometheusClient,
    PrometheusError,
    PrometheusFleet,
    check_url,
    host_history,
    prometheus_fleet,
    snapshots_from_series,
)
from gpustation.fleet.ssh import DOWN, UP
from tests.conftest import REPO, child_env, gpustation_cmd
from tests.fleet.promserver import (
    LoopbackPrometheus,
    RecordedExporter,
    start_exporter,
    stop_process,
    wait_for,
)
from tests.tools import tool

pytestmark = pytest.mark.timeout(240)
DCGM_FIXTURE = REPO / "tests" / "fixtures" / "dcgm-exporter-h100.prom"
DCGM_HOSTNAME = "dgx-h100-07"


def _fixture_results(text: str, instance: str = "h100:9400") -> list[dict[str, object]]:
    """The fixture as /api/v1/query would return it (one vector element per sample)."""
    out: list[dict[str, object]] = []
    for line in text.splitlines():
        m = re.fullmatch(r"([A-Za-z_:][\w:]*)\{(.*)\} (\S+)", line)
        if m:  # (Prometheus stores a counter under its name as written, without _total)
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m[2]))
            labels.update({"__name__": m[1], "instance": instance, "job": "gpu"})
            out.append({"metric": labels, "value": [1000.0, m[3]]})
    return out


# ---- without a server ----------------------------------------------------------------


def test_dcgm_exporter_series_fill_the_model() -> None:
    snaps = snapshots_from_series(_fixture_results(DCGM_FIXTURE.read_text()), {"h100:9400": 5.0})
    snap = snaps["h100:9400"]
    assert snap.hostname == DCGM_HOSTNAME and snap.time == 5.0 and not snap.simulated
    assert snap.driver_version == "550.90.07"
    assert [g.index for g in snap.gpus] == list(range(8))
    g = snap.gpu(2)
    assert g is not None
    assert g.name == "NVIDIA H100 80GB HBM3" and g.pci_bus_id == "00000000:3A:00.0"
    assert g.temperature_c == 63 and g.power_w == pytest.approx(618.7)
    assert g.clock_sm_mhz == 1980 and g.clock_mem_mhz == 2619 and g.utilization_gpu_pct == 97
    assert g.memory_used_mib == 71234 and g.memory_total_mib == 81559  # used + free + reserved
    assert g.throttle_reasons == ["sw_power_cap"]
    assert g.energy_j == pytest.approx(402116570123 / 1000 + 2 * 1000.003)
    assert g.pcie.tx_kib_s == pytest.approx(412300123 / 1024)
    assert snap.gpu(5).pcie.replay_errors == 3  # type: ignore[union-attr]
    # what dcgm-exporter does not export stays unknown
    assert g.power_limit_w is None and g.fans_pct == [] and g.pstate is None


def test_a_host_whose_newest_sample_is_old_is_stale() -> None:
    """No staleness markers (federation, remote write): the sample times tell."""
    fleet = PrometheusFleet(PrometheusClient("http://127.0.0.1:1"), interval=1.0)
    values = _fixture_results(DCGM_FIXTURE.read_text())

    def newest(t: float) -> list[dict[str, object]]:
        return [{"metric": {"instance": "h100:9400", "job": "gpu"}, "value": [0, str(t)]}]

    now = time.time()
    fleet._update(values, newest(now - 1.5), [])  # no up series at all: fresh is enough
    (st,) = fleet.states()
    assert st.state == UP and st.name == f"{DCGM_HOSTNAME} (h100:9400)"
    fleet._update(values, newest(now - 0.5), [])  # the next scrape: the interval is 1 s
    assert fleet.states()[0].state == UP and fleet.states()[0].interval == pytest.approx(1.0)
    # the same newest sample, still there more than three scrape intervals later
    fleet._targets["h100:9400"].last_sample = last = time.time() - 10
    fleet._update(values, newest(last), [])
    st = fleet.states()[0]
    assert st.state == DOWN and "stale: no new sample for 10 s" in (st.error or "")
    assert st.received_at == last
    # its last values stay, for the host screen
    assert st.snapshot is not None and len(st.snapshot.gpus) == 8


class _ScriptedClient(PrometheusClient):
    """Answers from recorded results; remembers the value queries it was asked."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:1")
        self.times = {"a:9400": 100.0, "b:9400": 100.0}
        self.asked: list[str] = []

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        if expr.startswith("max by (job, instance) ("):
            return [
                {"metric": {"instance": i, "job": "gpu"}, "value": [0, str(t)]}
                for i, t in self.times.items()
            ]
        if expr.startswith("up"):
            return [{"metric": {"instance": i}, "value": [0, "1"]} for i in self.times]
        if "DCGM_FI_DEV_GPU_UTIL" in expr:  # the changing values
            self.asked.append(expr)
            hosts = [i for i in self.times if "instance=~" not in expr or i in expr]
            return [r for h in hosts for r in _fixture_results(DCGM_FIXTURE.read_text(), h)]
        return []


def test_a_pass_reads_again_only_the_hosts_scraped_since(monkeypatch: pytest.MonkeyPatch) -> None:
    client = _ScriptedClient()
    fleet = PrometheusFleet(client)
    monkeypatch.setattr(time, "time", lambda: 101.0)
    fleet.poll_once()
    assert "instance=~" not in client.asked[-1]  # the first pass reads every host
    client.times["b:9400"] = 100.5  # b was scraped again, a was not
    fleet.poll_once()
    assert 'instance=~"b:9400"' in client.asked[-1] and "a:9400" not in client.asked[-1]
    states = {st.name.split(" (")[-1].rstrip(")"): st for st in fleet.states()}
    assert {st.state for st in states.values()} == {UP}  # a keeps the snapshot it had
    assert states["a:9400"].snapshot is not None and len(states["a:9400"].snapshot.gpus) == 8
    fleet.poll_once()  # nothing new anywhere: no value query at all
    assert len(client.asked) == 2


@pytest.mark.parametrize(
    "url", ["ftp://x", "prometheus:9090", "http://", "http://u:p@h:9090", "http://h:9090/?q=1"]
)
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(UsageError, match="--prometheus"):
        check_url(url)


def test_bad_url_exits_2_naming_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["snapshot", "--prometheus", "ftp://box:9090"])
    assert exc.value.code == EXIT_USAGE
    assert "--prometheus" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["--prometheus", "nohttp"])
    assert exc.value.code == EXIT_USAGE


def test_nothing_listening_exits_6_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["snapshot", "--prometheus", "http://127.0.0.1:1", "--json"]) == 6
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["schema"] == "gpustation.fleet/1"
    assert doc["hosts"][0]["ok"] is False and "cannot connect" in doc["hosts"][0]["error"]
    assert "Prometheus at http://127.0.0.1:1" in out.err and "Traceback" not in out.err


def test_config_keys(gpustation_dirs: dict[str, Path]) -> None:
    config = gpustation_dirs["config"] / "config.toml"
    config.write_text(
        '[fleet]\nprometheus = "http://prom:9090/"\nprometheus_match = \'job="gpu"\'\n'
    )
    got = load_fleet_config()
    assert got.prometheus == "http://prom:9090" and got.prometheus_match == 'job="gpu"'
    config.write_text('[fleet]\nprometheus = "prom:9090"\nprometheus_password_file = "x"\n')
    with pytest.raises(UsageError) as exc:
        load_fleet_config()
    assert "http://" in str(exc.value) and "needs prometheus_user" in str(exc.value)


@dataclass
class _Seen:
    authorization: str | None = None


@pytest.fixture
def fake_api() -> Iterator[tuple[str, _Seen]]:
    """A Prometheus API look-alike that records the Authorization header."""
    seen = _Seen()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.authorization = self.headers.get("Authorization")
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_credentials_go_only_to_the_configured_server(
    fake_api: tuple[str, _Seen], tmp_path: Path
) -> None:
    url, seen = fake_api
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    secret.chmod(0o600)
    config = FleetConfig(
        prometheus=url, prometheus_user="alice", prometheus_password_file=str(secret)
    )
    prometheus_fleet(url, config).client.query("up")
    assert seen.authorization == "Basic " + base64.b64encode(b"alice:s3cret").decode()
    token = tmp_path / "token"
    token.write_text("tok-123\n")
    token.chmod(0o600)
    prometheus_fleet(
        url, FleetConfig(prometheus=url, prometheus_token_file=str(token))
    ).client.query("up")
    assert seen.authorization == "Bearer tok-123"
    other = FleetConfig(prometheus="http://elsewhere:9090", prometheus_token_file=str(token))
    prometheus_fleet(url, other).client.query("up")
    assert seen.authorization is None
    token.chmod(0o644)
    with pytest.raises(UsageError, match="other users"):
        prometheus_fleet(url, FleetConfig(prometheus_token_file=str(token)))


def test_an_empty_prometheus_is_an_error(
    fake_api: tuple[str, _Seen], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = fake_api
    assert cli.main(["snapshot", "--prometheus", url]) == EXIT_UNREACHABLE
    assert "has no DCGM_FI_* or gpustation_* series" in capsys.readouterr().err


# ---- against a real Prometheus -------------------------------------------------------


@dataclass
class Lab:
    prom: LoopbackPrometheus
    exporters: dict[str, tuple[subprocess.Popen[bytes], Path]]  # instance -> (process, state dir)
    dcgm_instance: str


#: a dcgm-exporter host whose every value is NaN (cards that answer nothing)
NAN_INSTANCE = "nanbox:9400"
NAN_PAGE = "".join(
    f'{name}{{gpu="{gpu}",UUID="GPU-nan-{gpu}",modelName="NVIDIA H100 80GB HBM3",'
    f'Hostname="nanbox"}} NaN\n'
    for gpu in (0, 1)
    for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL")
).encode()


def _pin_loads(state_dir: Path, loads: tuple[float, ...]) -> None:
    """A steady load on each simulated card of an exporter's machine.

    The synthetic schedule changes every 45 s, so an exporter's value as last
    scraped and its own reading a moment later could straddle a change; with
    the load pinned they agree on power.
    """
    from gpustation.telemetry.sim import SimBackend

    (path,) = state_dir.glob("sim-*-*.json")
    state = json.loads(path.read_text())
    sim = SimBackend(state["count"], state["card"], state["seed"], state_path=path)
    for index, load in enumerate(loads):
        sim.poke(index, load=load)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    binary = tool("prometheus", "Debian: prometheus")
    work = tmp_path_factory.mktemp("prom")
    exporters: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    recorded = RecordedExporter({"/metrics": DCGM_FIXTURE.read_bytes(), "/nan": NAN_PAGE}).start()
    prom = LoopbackPrometheus(binary, work)
    try:
        for name in ("a", "b", "doomed"):
            proc, port = start_exporter(work / f"host-{name}", count=2)
            _pin_loads(work / f"host-{name}", (0.3, 0.6))
            exporters[f"127.0.0.1:{port}"] = (proc, work / f"host-{name}")
        dcgm = f"127.0.0.1:{recorded.port}"
        prom.start({"gpu": [*exporters, dcgm, f"{dcgm}/nan@{NAN_INSTANCE}"]})
        prom.wait_targets(len(exporters) + 2)
        yield Lab(prom, exporters, dcgm)
    finally:
        prom.stop()
        for proc, _ in exporters.values():
            stop_process(proc)
        recorded.stop()


def _fleet(lab: Lab) -> PrometheusFleet:
    return PrometheusFleet(PrometheusClient(lab.prom.url), interval=0.5)


def _first_complete(lab: Lab, fleet: PrometheusFleet) -> None:
    """Until every target shows its GPUs (the first scrapes may still be landing)."""
    wanted = set(lab.exporters) | {lab.dcgm_instance}

    def complete() -> bool:
        names = " ".join(st.name for st in fleet.states() if st.state == UP and st.snapshot)
        return all(inst in names for inst in wanted)

    wait_for("every target up in the fleet", complete, timeout=30)


def test_snapshot_lists_every_target_with_the_exporters_values(lab: Lab) -> None:
    with _fleet(lab) as fleet:
        _first_complete(lab, fleet)
    proc = subprocess.run(
        gpustation_cmd("snapshot", "--prometheus", lab.prom.url, "--json"),
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "gpustation.fleet/1"
    hosts = {h["host"]: h for h in doc["hosts"]}
    dcgm = hosts[f"{DCGM_HOSTNAME} ({lab.dcgm_instance})"]
    assert dcgm["ok"] and dcgm["snapshot"]["hostname"] == DCGM_HOSTNAME
    assert len(dcgm["snapshot"]["gpus"]) == 8
    assert dcgm["snapshot"]["gpus"][3]["temperature_c"] == 32.0  # an idle card
    for instance, (exporter, state_dir) in lab.exporters.items():
        if exporter.poll() is not None:
            continue  # the stale-host test ended it
        entry = next(
            h for name, h in hosts.items() if name.endswith(f"({instance})") or name == instance
        )
        assert entry["ok"], entry
        got = entry["snapshot"]
        assert got["simulated"] is True
        # the exporter's own reading of the same simulated machine
        own = json.loads(
            subprocess.run(
                gpustation_cmd("snapshot", "--json", "--simulate", "2"),
                env=child_env(GPUSTATION_STATE_DIR=str(state_dir)),
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
        )
        assert got["hostname"] == own["hostname"]
        for mine, theirs in zip(got["gpus"], own["gpus"], strict=True):
            for key in ("index", "uuid", "name", "pci_bus_id", "memory_total_mib",
                        "power_limit_w", "power_max_w", "clock_sm_max_mhz"):  # fmt: skip
                assert mine[key] == theirs[key], key
            assert mine["pcie"]["max_gen"] == theirs["pcie"]["max_gen"]
            # sampled a moment apart: temperature close, power (at a pinned load) the same
            assert abs(mine["temperature_c"] - theirs["temperature_c"]) < 15
            assert mine["power_w"] == pytest.approx(theirs["power_w"], abs=1.0)
            assert len(mine["fans_pct"]) == len(theirs["fans_pct"])
    assert proc.returncode == (0 if all(h["ok"] for h in hosts.values()) else EXIT_UNREACHABLE)


def test_history_from_query_range(lab: Lab) -> None:
    instance = next(iter(lab.exporters))
    client = PrometheusClient(lab.prom.url)
    wait_for("three scrapes", lambda: len(host_history(client, instance, minutes=5)) >= 3, 30)
    history = host_history(client, instance, minutes=5)
    assert history.gpus() == [0, 1]
    temps = [v for v in history.values(0, "temp") if v is not None]
    assert temps and all(20 <= t <= 110 for t in temps)
    assert any(v is not None for v in history.values(1, "power"))


def test_fleet_screen_and_host_history(lab: Lab) -> None:
    asyncio.run(_fleet_screen_and_host_history(lab))


async def _fleet_screen_and_host_history(lab: Lab) -> None:
    from gpustation.tui.fleet.screen import FleetApp, FleetScreen, HostScreen

    fleet = _fleet(lab)
    app = FleetApp([], fleet=fleet)
    async with app.run_test(size=(160, 40)) as pilot:
        for _ in range(300):
            screen = app.screen
            if isinstance(screen, FleetScreen) and any(
                r.gpu is not None and r.host.startswith(DCGM_HOSTNAME) for r in screen.rows
            ):
                break
            await pilot.pause(0.1)
        assert isinstance(app.screen, FleetScreen)
        host = next(r.host for r in app.screen.rows if r.host.startswith(DCGM_HOSTNAME))
        app.screen.open_host(host)
        for _ in range(300):
            if isinstance(app.screen, HostScreen) and app.screen._own_history:
                break
            await pilot.pause(0.1)
        assert isinstance(app.screen, HostScreen) and app.screen._own_history
        assert app.screen.history.gpus() == list(range(8))


def test_a_killed_exporter_goes_down_with_its_last_sample_time(lab: Lab) -> None:
    instance, (proc, _) = list(lab.exporters.items())[-1]
    with _fleet(lab) as fleet:
        _first_complete(lab, fleet)
        name = next(st.name for st in fleet.states() if instance in st.name)
        stop_process(proc, kill=True)
        killed_at = time.time()
        wait_for("the killed host down", lambda: fleet.state(name).state == DOWN, 30)
        st = fleet.state(name)
        assert st.received_at is not None and killed_at - 5 < st.received_at <= killed_at + 0.5
        assert "last sample" in (st.error or "")
        assert time.strftime("%H:%M:%S", time.localtime(st.received_at)) in (st.error or "")
        others = [s for s in fleet.states() if s.name != name]
        assert others and all(s.state == UP for s in others)
        entry = next(h for h in fleet_document(fleet.states())["hosts"] if h["host"] == name)
        assert entry["ok"] is False and entry["last_sample_time"] == st.received_at
    # a new source started after the death still finds the host, with its last sample
    with _fleet(lab) as later:
        later.wait_first(20)
        st = later.state(name)
        assert st.state == DOWN and st.received_at is not None
        assert abs(st.received_at - killed_at) < 10


def test_a_host_whose_every_value_is_nan_is_listed_with_values_na(lab: Lab) -> None:
    with _fleet(lab) as fleet:
        wait_for(
            "the NaN host listed",
            lambda: fleet.state(NAN_INSTANCE).snapshot is not None,
            timeout=30,
        )
        st = fleet.state(NAN_INSTANCE)
        rows = [r for r in fleet.rows() if r.host == NAN_INSTANCE]
    assert st.state == UP and st.snapshot is not None
    assert [g.uuid for g in st.snapshot.gpus] == ["GPU-nan-0", "GPU-nan-1"]
    assert all(g.temperature_c is None and g.power_w is None for g in st.snapshot.gpus)
    assert len(rows) == 2
    cells = row_cells(rows[0])
    assert cells["temp"] == "n/a" and cells["util"] == "n/a" and cells["status"] == "up"


def test_prometheus_errors_are_messages(lab: Lab) -> None:
    with pytest.raises(PrometheusError, match=r"query failed|HTTP 400"):
        PrometheusClient(lab.prom.url).query("sum(")


def test_fleet_option_reads_the_configured_prometheus(
    fake_api: tuple[str, _Seen],
    gpustation_dirs: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, _ = fake_api
    (gpustation_dirs["config"] / "config.toml").write_text(f'[fleet]\nprometheus = "{url}"\n')
    assert cli.main(["snapshot", "--fleet"]) == EXIT_UNREACHABLE
    assert f"Prometheus at {url} has no DCGM_FI_*" in capsys.readouterr().err


def test_memory_temperature_series_fill_the_model() -> None:
    labels = {"instance": "h200:9400", "job": "gpu", "gpu": "0", "UUID": "GPU-1"}
    results = [
        {"metric": {**labels, "__name__": "DCGM_FI_DEV_MEMORY_TEMP"}, "value": [1.0, "41"]},
        {
            "metric": {**labels, "__name__": "gpustation_memory_temperature_max_celsius"},
            "value": [1.0, "95"],
        },
        {
            "metric": {**labels, "__name__": "gpustation_temperature_margin_celsius"},
            "value": [1.0, "52"],
        },
    ]
    g = snapshots_from_series(results)["h200:9400"].gpu(0)
    assert g is not None
    assert (g.memory_temperature_c, g.memory_temperature_max_c, g.temperature_margin_c) == (
        41,
        95,
        52,
    )
