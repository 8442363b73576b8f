"""What the operator writes on a pool's nodes, and the node agent reads back.

The operator marks each node of a pool with the label ``rocshare.io/pool=<name>``
and the annotation ``rocshare.io/pool-settings`` holding the pool's `Sharing` and
health settings as versioned JSON; for HAMi compatibility it also writes
``hami.io/amd-operating-mode``. The agent decodes the settings annotation; a
missing or undecodable one means defaults, reported with the reason.
"""

from __future__ import annotations

import json

from pydantic import Field, ValidationError

from rocshare.api.models import HealthSource, Sharing, _Model

POOL_LABEL = "rocshare.io/pool"
POOL_SETTINGS_ANNOTATION = "rocshare.io/pool-settings"
HAMI_OPERATING_MODE_ANNOTATION = "hami.io/amd-operating-mode"
PENDING_MODE_ANNOTATION = "rocshare.io/pending-operating-mode"
"""On a node that holds GPU pods while its pool's operating mode changed: the mode it switches
to once drained (it keeps its current settings until then)."""
HAMI_NODE_REGISTER_ANNOTATION = "hami.io/node-amd-register"
HAMI_POD_DEVICES_ANNOTATION = "hami.io/amd-devices-allocated"


class NodeSettings(_Model):
    version: int = Field(default=1, ge=1, le=1)
    pool: str = Field(min_length=1)
    sharing: Sharing = Field(default_factory=Sharing)
    health: HealthSource = Field(default_factory=HealthSource)


class SettingsError(ValueError):
    pass


def encode_settings(settings: NodeSettings) -> str:
    return json.dumps(settings.to_json_dict(), separators=(",", ":"), sort_keys=True)


def decode_settings(text: str) -> NodeSettings:
    """Parse the annotation; raises SettingsError saying what is wrong."""
    try:
        return NodeSettings.model_validate_json(text)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(root)"
        raise SettingsError(f"{POOL_SETTINGS_ANNOTATION} is invalid at {where}: {first['msg']}") from None
