"""The node's `video` and `render` group ids, read from the host's group file.

GPU device files are owned by these groups (`/dev/kfd` and `/dev/dri/renderD*` by `render`,
`/dev/dri/card*` by `video` on most distributions), and their ids differ between nodes. The
agent publishes them in AmdGpuNode status (``status.deviceGroups``), so an admin who prefers
`supplementalGroups` in pod specs can see what each node needs; rocshare itself gives a
non-root container device files it can open in Allocate (deviceplugin/pod_devices.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

from rocshare.api.models import DeviceGroup

log = logging.getLogger(__name__)

DEVICE_GROUP_NAMES = ("video", "render")


def parse_device_groups(text: str) -> list[DeviceGroup]:
    """`name:password:gid:members` lines; the device groups found, in DEVICE_GROUP_NAMES order.
    Malformed lines are skipped (a group file is the host's, not ours to refuse)."""
    gids: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and fields[0] in DEVICE_GROUP_NAMES and fields[2].isdigit():
            gids.setdefault(fields[0], int(fields[2]))
    return [DeviceGroup(name=name, gid=gids[name]) for name in DEVICE_GROUP_NAMES if name in gids]


def read_device_groups(group_file: Path | None) -> list[DeviceGroup]:
    if group_file is None:
        return []
    try:
        return parse_device_groups(Path(group_file).read_text(errors="replace"))
    except OSError as error:
        log.warning("cannot read the host group file %s: %s (device groups not published)", group_file, error)
        return []
