"""The shipped Grafana dashboard loads and asks only for metrics the exporter emits."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpustation.paths import package_dir
from gpustation.serve.exporter import Exporter
from gpustation.telemetry.sampler import Sampler
from gpustation.telemetry.sim import SimBackend
from tests.tools import tool

DASHBOARD = package_dir() / "assets" / "grafana-dashboard.json"
# A metric name as PromQL writes one: not a function, keyword or label.
_NAME = re.compile(r"\b([A-Za-z_:][A-Za-z0-9_:]*)\s*(?=\{|\[|\)|$|\s[-+*/<>]|\s*$)")
_NOT_METRICS = {"sum", "increase", "rate", "by", "label_values", "avg", "max", "min"}


def _queries(doc: dict[str, Any]) -> list[str]:
    out = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    for var in doc["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict):
            # label_values(METRIC{...}, LABEL): the metric is what must exist
            inner = query["query"].removeprefix("label_values(").rstrip(")")
            out.append(inner.rpartition(",")[0] or inner)
    return out


def _metric_names(expr: str) -> set[str]:
    expr = re.sub(r"\{[^}]*\}", "{}", expr)  # label matchers hold no metric names
    expr = re.sub(r"\[[^\]]*\]", "[]", expr)
    return {m for m in _NAME.findall(expr) if m not in _NOT_METRICS and not m.startswith("$")}


def _emitted(tmp_path: Path) -> set[str]:
    backend = SimBackend(count=2, seed=0, state_path=tmp_path / "sim.json")
    exporter = Exporter(Sampler(backend).sample, interval_s=60, with_extras=False)
    exporter.sample_once()
    text = generate_latest(exporter.registry).decode()
    names = {f.name for f in text_string_to_metric_families(text)}
    # present when there are runs in the history (tested in test_exporter.py)
    return names | {"gpustation_runs"}


def test_the_dashboard_is_importable_json_with_panels() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and doc["title"] and doc["schemaVersion"] >= 36
    assert len(doc["panels"]) >= 10
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for panel in doc["panels"]:
        assert panel["targets"], panel["title"]


def test_every_metric_the_dashboard_queries_is_one_the_exporter_emits(tmp_path: Path) -> None:
    doc = json.loads(DASHBOARD.read_text())
    used = set().union(*(_metric_names(q) for q in _queries(doc)))
    assert {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "gpustation_throttle_reason"} <= used
    assert used <= _emitted(tmp_path), sorted(used - _emitted(tmp_path))


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    promtool = tool("promtool", "Debian: prometheus")
    doc = json.loads(DASHBOARD.read_text())
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {
                        "record": f"dashboard:q{i}",
                        "expr": q.replace("$__range", "1h")
                        .replace('"$instance"', '".*"')
                        .replace('"$gpu"', '".*"'),
                    }
                    for i, q in enumerate(t["expr"] for p in doc["panels"] for t in p["targets"])
                ],
            }
        ]
    }
    path = tmp_path / "rules.json"  # YAML is a superset of JSON
    path.write_text(json.dumps(rules))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
