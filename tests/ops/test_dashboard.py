"""deploy/grafana-dashboard.json only charts series Sandhive really exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from app import metrics
from tests.ops.test_metrics_e2e import API_SERIES

ROOT = Path(__file__).resolve().parents[2]


def worker_series() -> set[str]:
    names = set()
    for family in metrics.REGISTRY.collect():
        names |= {sample.name for sample in family.samples} | {family.name}
        if family.type == "counter":  # a labelled counter has no sample before its first inc
            names.add(f"{family.name}_total")
    return names


def test_every_dashboard_series_exists() -> None:
    dashboard = json.loads((ROOT / "deploy/grafana-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    used = {name for expr in exprs for name in re.findall(r"sandhive_[a-z_]+", expr)}
    known = worker_series() | API_SERIES | {"sandhive_tasks_failed"}
    missing = {
        name for name in used if name not in known and name.removesuffix("_bucket") not in known
    }
    assert not missing, missing
    assert len(used) >= 15
