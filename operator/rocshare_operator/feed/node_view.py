"""A Node's labels and the marks the operator keeps on it, as the cluster feed decodes them and
pool membership (status/pool_logic.py) reads them. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rocshare.api.models import Sharing
from rocshare.api.node_settings import (
    HAMI_OPERATING_MODE_ANNOTATION,
    PENDING_MODE_ANNOTATION,
    POOL_LABEL,
    POOL_SETTINGS_ANNOTATION,
    SettingsError,
    decode_settings,
)


@dataclass(frozen=True)
class NodeView:
    """A Node's labels and the marks the operator keeps on it."""

    name: str
    labels: tuple[tuple[str, str], ...]
    marks: NodeMarks

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)


@dataclass(frozen=True)
class NodeMarks:
    """The pool label and the annotations; None means absent."""

    pool: str | None = None
    settings_json: str | None = None
    operating_mode: str | None = None
    pending_mode: str | None = None
    """The mode a busy node switches to once drained (status/pool_logic.py's invariants)."""

    @property
    def any(self) -> bool:
        # The operating-mode annotation alone is not evidence that we marked the node.
        return self.pool is not None or self.settings_json is not None

    def sharing(self) -> Sharing | str:
        """The pool's sharing settings the operator wrote on the node (none written: the defaults,
        a node in no pool), or why they cannot be read."""
        if self.settings_json is None:
            return Sharing()
        try:
            return decode_settings(self.settings_json).sharing
        except SettingsError as error:
            return str(error)


def marks_of(labels: Mapping[str, str], annotations: Mapping[str, str],
             keep: Callable[[str | None], str | None] = lambda value: value) -> NodeMarks:
    """The marks a Node carries; `keep` may intern the values (the cluster feed does)."""
    return NodeMarks(pool=keep(labels.get(POOL_LABEL)), settings_json=keep(annotations.get(POOL_SETTINGS_ANNOTATION)),
                     operating_mode=keep(annotations.get(HAMI_OPERATING_MODE_ANNOTATION)),
                     pending_mode=keep(annotations.get(PENDING_MODE_ANNOTATION)))
