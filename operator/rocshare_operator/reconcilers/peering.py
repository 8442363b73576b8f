"""Kopf peering, owned by the operator: who this replica is, and the peering object itself.

* Identity: Kopf names a peer after `getpass.getuser()`, which raises KeyError in the image
  (uid 65532 has no passwd entry). We give it one: the pod's name (`POD_NAME`, from the
  downward API in the Deployment; Kopf's own `POD_ID` is honoured too), else
  `rocshare-operator@<host>/<pid>/<start time>` -- never a user-name lookup.
* The ClusterKopfPeering `rocshare`: created at start when missing. The manifests ship only
  its definition, because an object in the same apply as its CRD fails on the first run
  ("no matches for kind ClusterKopfPeering").
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
from collections.abc import Mapping

from rocshare.kube.client import Conflict, Kube, NotFound, object_path

log = logging.getLogger(__name__)
PEERING_NAME = "rocshare"
PEERING_API = "kopf.dev/v1"


def own_identity(environ: Mapping[str, str], *, hostname: str, pid: int, started: datetime.datetime) -> str:
    for variable in ("POD_NAME", "POD_ID"):
        if environ.get(variable):
            return environ[variable]
    return f"rocshare-operator@{hostname}/{pid}/{started:%Y%m%d%H%M%S}"


def this_process_identity() -> str:
    return own_identity(os.environ, hostname=socket.gethostname(), pid=os.getpid(),
                        started=datetime.datetime.now(datetime.UTC))


async def ensure_peering_object(kube: Kube, name: str = PEERING_NAME) -> None:
    path = object_path(PEERING_API, "clusterkopfpeerings", name)
    try:
        await kube.get(path)
        return
    except NotFound:
        pass
    body = {"apiVersion": PEERING_API, "kind": "ClusterKopfPeering",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "rocshare"}}}
    try:
        await kube.create(object_path(PEERING_API, "clusterkopfpeerings"), body)
        log.info("created ClusterKopfPeering %s", name)
    except Conflict:
        pass  # another replica made it
