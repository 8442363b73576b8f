"""A DRA pod's GPU request as the user wrote it: the pod annotation ``rocshare.io/dra-request``. Pure.

The admission webhook turns a pod's ``amd.com/*`` limits into claims (DRA pools) and strips them,
so the pod alone no longer says what it asks. It keeps them here, per container, so the
extender's score-only step (``prioritize`` for DRA pods) reads the same request the device-plugin
path reads: the pod with these limits put back, through the same parser
(rocshare.core.holdings.placement_request). Versioned JSON; a text that does not decode is an
error, never an empty request.

What it may steer: only the node *score* of its own pod (kube-scheduler's DRA allocator still
decides what fits, from the claim), so a tenant who forges it moves nothing but their own pod.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from rocshare.api.annotation_json import decode_annotation, encode_annotation
from rocshare.api.models import _Model

DRA_REQUEST_ANNOTATION = "rocshare.io/dra-request"
"""Pod annotation: the amd.com/* limits admission turned into the pod's claims (DraRequest JSON)."""


class DraRequestError(ValueError):
    """The annotation cannot be decoded; says what is wrong."""


class ContainerLimits(_Model):
    kind: Literal["containers", "initContainers"] = Field(description="Which list of the pod spec.")
    index: int = Field(ge=0, description="The container's position in that list.")
    limits: dict[str, str] = Field(min_length=1, description="Its amd.com/* limits (requests count as limits).")


class DraRequest(_Model):
    version: Literal[1] = 1
    containers: list[ContainerLimits] = Field(min_length=1, description="Each container that asked amd.com/*.")


def encode_request(request: DraRequest) -> str:
    return encode_annotation(request)


def decode_request(text: str) -> DraRequest:
    """Parse the annotation's text; raises DraRequestError naming the problem."""
    return decode_annotation(text, DraRequest, annotation=DRA_REQUEST_ANNOTATION, error=DraRequestError)


def request_of(pod: Mapping[str, Any]) -> DraRequest | None:
    """The pod's DRA request, None when it carries none. Raises DraRequestError."""
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(DRA_REQUEST_ANNOTATION)
    return None if text is None else decode_request(text)


def with_limits(pod: Mapping[str, Any], request: DraRequest) -> dict[str, Any]:
    """The pod as the user wrote it: each listed container with its amd.com/* limits back (a copy).
    Raises DraRequestError when a listed container is not in the pod."""
    restored = copy.deepcopy(dict(pod))
    spec = restored.setdefault("spec", {})
    for entry in request.containers:
        containers = spec.get(entry.kind) or []
        if entry.index >= len(containers):
            raise DraRequestError(f"{DRA_REQUEST_ANNOTATION} names {entry.kind}[{entry.index}], which the pod lacks")
        resources = containers[entry.index].setdefault("resources", {})
        resources["limits"] = {**(resources.get("limits") or {}), **entry.limits}
    return restored
