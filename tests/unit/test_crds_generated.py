"""crds/ is generated from the pydantic models: the committed files must match, and the
schemas must be structural (every node typed, no $ref or anyOf left)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rocshare.api.crdgen import all_crds
from rocshare.api.crds_cli import render

CRD_DIR = Path(__file__).resolve().parents[2] / "crds"


@pytest.mark.parametrize("name", sorted(all_crds()))
def test_committed_crd_matches_models(name: str) -> None:
    assert (CRD_DIR / name).read_text() == render(all_crds()[name]), "run `make crds`"


def _walk(schema: dict, where: str):
    yield where, schema
    for key, child in schema.get("properties", {}).items():
        yield from _walk(child, f"{where}.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _walk(schema[key], f"{where}[{key}]")


@pytest.mark.parametrize("name", sorted(all_crds()))
def test_schema_is_structural(name: str) -> None:
    schema = yaml.safe_load((CRD_DIR / name).read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for where, node in _walk(schema, name):
        assert "type" in node, f"{where} has no type"
        assert not {"$ref", "anyOf", "allOf", "title"} & node.keys(), f"{where} is not structural"


def _described_nodes(schema: dict, where: str):
    """Every node `kubectl explain` prints a description for: the root, every named property at
    any depth, and every list item or map value that is itself a typed object (a model)."""
    yield where, schema
    for key, child in schema.get("properties", {}).items():
        yield from _described_nodes(child, f"{where}.{key}")
    for key in ("items", "additionalProperties"):
        child = schema.get(key)
        # A scalar or free-form item (a string, a map) is described by its field, as explain shows it.
        if isinstance(child, dict) and "properties" in child:
            yield from _described_nodes(child, f"{where}[{key}]")


@pytest.mark.parametrize("name", sorted(all_crds()))
def test_every_field_has_a_description(name: str) -> None:
    """`kubectl explain` shows a description for every field: the committed schema carries one."""
    schema = yaml.safe_load((CRD_DIR / name).read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    # The API server forbids anything but a type on the root's metadata, and explains it as ObjectMeta.
    assert schema["properties"]["metadata"] == {"type": "object"}
    missing = [where for where, node in _described_nodes(schema, name)
               if not str(node.get("description", "")).strip() and where != f"{name}.metadata"]
    assert not missing, f"fields without a description (add Field(description=...) in models.py): {missing}"
    assert len(list(_described_nodes(schema, name))) > 10  # the walk reached the nested fields
