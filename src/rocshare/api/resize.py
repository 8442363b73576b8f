"""The resize request: what a tenant asks of a running pod's slice, and what answers it.

A user (`kubectl rocshare resize`, or by hand) writes the request annotation
``rocshare.io/resize`` on the pod: versioned JSON naming the container, its new memory per GPU
and/or its new gpucores percent, and a generation larger than every one before. It is the only
thing of a resize a tenant writes. The operator's leader decides it (rocshare.core.resize) and
answers with a new allocation record carrying ``resizeGeneration`` (protected like every record,
policy/pods.yaml) and the pod condition ``rocshare.io/Resized`` (in status: a tenant with `edit`
cannot write it). Decoding a request that does not match is an error naming the problem.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rocshare.api.annotation_json import decode_annotation, encode_annotation
from rocshare.api.models import _Model

RESIZE_ANNOTATION = "rocshare.io/resize"
"""Pod annotation holding the ResizeRequest JSON; written by the user (the kubectl plugin)."""

RESIZED_CONDITION = "rocshare.io/Resized"
"""Pod condition the operator sets: True once a generation is applied, False when one is refused."""

RESIZED_REASON = "Resized"
"""The condition's and the Event's reason when the request was applied."""

GENERATION_MAX = 2**31 - 1
MEMORY_MIB_MAX = 16 * 1024 * 1024
"""16 TiB per GPU: past any GPU made, so a larger figure is a typo, not a request."""


class ResizeError(ValueError):
    """A request that cannot be decoded or makes no sense; says what is wrong."""


class ResizeRequest(_Model):
    version: Literal[1] = 1
    generation: int = Field(ge=1, le=GENERATION_MAX, description="Larger than every earlier request of the pod.")
    container: str | None = Field(
        default=None, min_length=1,
        description="The container to resize; omitted: the pod's only container holding a GPU slice.",
    )
    memory_mib: int | None = Field(default=None, alias="memoryMiB", ge=1, le=MEMORY_MIB_MAX,
                                   description="The new amd.com/gpumem, MiB per GPU; omitted: unchanged.")
    cores_pct: int | None = Field(default=None, alias="coresPct", ge=1, le=100,
                                  description="The new amd.com/gpucores, percent of each GPU's CUs; omitted: same.")

    @model_validator(mode="after")
    def _asks_something(self) -> ResizeRequest:
        if self.memory_mib is None and self.cores_pct is None:
            raise ValueError("a resize names memoryMiB, coresPct or both")
        return self


def encode_request(request: ResizeRequest) -> str:
    return encode_annotation(request)


def decode_request(text: str) -> ResizeRequest:
    """Parse the annotation's text; raises ResizeError naming the problem."""
    return decode_annotation(text, ResizeRequest, annotation=RESIZE_ANNOTATION, error=ResizeError)


def request_generation(text: str | None) -> int:
    """The generation of the request text on a pod (0 when there is none or it cannot be read):
    the plugin's next request goes past it."""
    if text is None:
        return 0
    try:
        return decode_request(text).generation
    except ResizeError:
        return 0


def condition_message(generation: int, text: str) -> str:
    """The rocshare.io/Resized condition's message: the generation it answers, then what happened.
    The generation leads so `kubectl rocshare resize` (and a user's `kubectl wait --for=jsonpath`)
    can tell this answer from an earlier one."""
    return f"generation {generation}: {text}"[:1024]


def answers(message: str, generation: int) -> bool:
    """True when a Resized condition's message answers that generation (see `condition_message`)."""
    return message.startswith(f"generation {generation}: ")
