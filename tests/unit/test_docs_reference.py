"""The generated reference pages (docs/reference/*.md, `rocshare-dev docs reference`) agree with the
code: the committed pages are what the generator writes now, and each page is checked against its
source read here independently — every CRD field with its description, every metric the product's
code constructs (found by reading the code), every Helm value with its default.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import yaml

from rocshare_dev import docsgen

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
PRODUCT = ("src/rocshare", "operator/rocshare_operator", "nodeagent/rocshare_agent")
METRIC_CONSTRUCTORS = {"GaugeMetricFamily": "gauge", "CounterMetricFamily": "counter", "Counter": "counter",
                       "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary",
                       "HistogramMetricFamily": "histogram", "SummaryMetricFamily": "summary"}


def _rows(page: str, section: str = "") -> dict[str, list[str]]:
    """First cell (its backquoted name) -> the row's cells, for every table row of a page (of its
    `## <section>` only, when one is named)."""
    text = (REFERENCE / page).read_text()
    if section:
        text = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        match = re.match(r"^`([^`]+)`", cells[0]) if line.startswith("|") else None
        if match:
            rows.setdefault(match.group(1), cells)
    return rows


def test_committed_pages_are_generated_from_the_code() -> None:
    assert not docsgen.differences(docsgen.generate()), "run `rocshare-dev docs reference`"


def _fields(schema: dict, path: str = ""):
    for name, child in schema.get("properties", {}).items():
        where = f"{path}.{name}" if path else name
        yield where, child
        inner = child.get("items") if child.get("type") == "array" else child
        yield from _fields(inner or {}, f"{where}[]" if child.get("type") == "array" else where)


def test_every_crd_field_is_on_the_crd_page_with_its_description() -> None:
    checked = 0
    for path in sorted((ROOT / "crds").glob("*.rocshare.io.yaml")):
        crd = yaml.safe_load(path.read_text())
        kind, root = crd["spec"]["names"]["kind"], crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        rows = _rows("crds.md", kind)
        for where, node in _fields(root):
            if where in ("apiVersion", "kind", "metadata"):
                continue
            assert where in rows, f"{kind} field {where} is not on docs/reference/crds.md"
            words = node["description"].split()[:4]
            assert " ".join(words).replace("<", "&lt;") in rows[where][2], f"{where}: description differs"
            checked += 1
    assert checked > 80  # three kinds, every nested field


def _metric_names_in_code() -> dict[str, str]:
    """Metric name -> type, from every metric constructor call in the product (a name given by a
    module constant is resolved)."""
    found = {}
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            constants = {node.targets[0].id: node.value.value for node in tree.body
                         if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                         and isinstance(node.value, ast.Constant)}
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and node.args):
                    continue
                called = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                if called not in METRIC_CONSTRUCTORS:
                    continue
                first = node.args[0]
                name = first.value if isinstance(first, ast.Constant) else constants.get(getattr(first, "id", ""))
                if isinstance(name, str):
                    kind = METRIC_CONSTRUCTORS[called]
                    found[name.removesuffix("_total") + ("_total" if kind == "counter" else "")] = kind
    return found


def test_every_metric_the_code_constructs_is_on_the_metrics_page() -> None:
    in_code, rows = _metric_names_in_code(), _rows("metrics.md")
    assert len(in_code) >= 25
    assert set(rows) == set(in_code), \
        f"only in code: {set(in_code) - set(rows)}; only on the page: {set(rows) - set(in_code)}"
    for name, kind in in_code.items():
        assert rows[name][1] == kind, f"{name}: page says {rows[name][1]}, code constructs a {kind}"


def test_the_metrics_page_agrees_with_the_reference() -> None:
    """Every series docs/metrics.md describes is one the code registers, with its type and labels."""
    reference = _rows("metrics.md")
    described = 0
    for line in (ROOT / "docs" / "metrics.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not re.match(r"^`(hami|rocshare)_", cells[0]):
            continue
        name = cells[0].strip("`")
        assert name in reference, f"docs/metrics.md describes {name}, which the code does not register"
        assert cells[1] == reference[name][1], \
            f"{name}: type {cells[1]} on docs/metrics.md, {reference[name][1]} in code"
        assert set(re.findall(r"`([a-z_]+)`", cells[2])) == set(re.findall(r"`([a-z_]+)`", reference[name][2])), \
            f"{name}: labels on docs/metrics.md differ from the code's"
        described += 1
    assert described == len(reference), "docs/metrics.md leaves out series the code registers"


def test_every_helm_value_is_on_the_values_page_with_its_default() -> None:
    values = yaml.safe_load((ROOT / "charts" / "rocshare" / "values.yaml").read_text())
    rows = _rows("helm-values.md")
    assert rows
    for key, cells in rows.items():
        node = values
        for part in key.split("."):
            node = node[part]
        assert json.loads(cells[1].strip("`").replace("\\|", "|")) == node, key
        assert cells[3], f"{key}: no description"
    # Every top-level section of the values is documented.
    assert {key.split(".")[0] for key in rows} == set(values)


def test_metrics_named_in_the_user_pages_exist() -> None:
    """The observability page's alert expressions and the troubleshooting page name real series."""
    known = {name.removesuffix("_total") for name in _rows("metrics.md")}
    for page in ("observability.md", "troubleshooting.md"):
        text = (ROOT / "docs" / page).read_text()
        named = set(re.findall(r"\b((?:hami|rocshare)_[a-z_]+)", text))
        series = {re.sub(r"_(bucket|count|sum|total)$", "", name) for name in named}
        assert named and not series - known, f"{page} names series rocshare does not export: {series - known}"
