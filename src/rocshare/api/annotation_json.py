"""Versioned JSON annotations: the one codec behind rocshare's records on Kubernetes objects (the
allocation record, the resize request, the DRA pod's request). Compact, keys sorted, version 1;
decoding refuses, naming the annotation and the problem, what is not JSON, not an object, of another
version, or not the model."""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import ValidationError

from rocshare.api.models import _Model

M = TypeVar("M", bound=_Model)


def encode_annotation(model: _Model) -> str:
    return json.dumps(model.to_json_dict(), separators=(",", ":"), sort_keys=True)


def decode_annotation(text: str, model: type[M], *, annotation: str, error: type[ValueError]) -> M:
    """`text` as `model`; raises `error` naming `annotation` and the first problem."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, TypeError) as problem:
        raise error(f"{annotation} is not JSON: {problem}") from None
    if not isinstance(data, dict):
        raise error(f"{annotation} must be a JSON object, got {type(data).__name__}")
    if data.get("version") != 1:
        raise error(f"{annotation} has unsupported version {data.get('version')!r} (this build reads 1)")
    try:
        return model.model_validate(data)
    except ValidationError as problem:
        raise error(f"{annotation} is invalid: {first_problem(problem)}") from None


def first_problem(error: ValidationError) -> str:
    """The first of pydantic's problems as `where: what`."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(root)"
    return f"{where}: {first['msg']}"
