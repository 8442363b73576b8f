"""CDI specs for prepared claims: what the container runtime injects, and the agent's record.

One spec file per prepared claim, ``<cdi dir>/rocshare.io-gpu_<claim uid>.json``, kind
``rocshare.io/gpu``, one device named after the claim uid whose container edits are what DESIGN
section 4 gives a slice (environment, device nodes, the hook mount). The file is also the
record of what the claim holds (annotation ``rocshare.io/prepared``: the claim and its
DeviceSlices), so the CDI folder is the node's ledger: a restarted agent reads it back and never
hands the same CUs out twice. Files are written whole (temporary file, fsync, rename): a crash
leaves the old state or the new one, never half of one.

CDI spec version 0.6.0 (spec-level annotations); containerd 2.x and CRI-O read it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from rocshare.api.allocation import DeviceSlice
from rocshare_agent.deviceplugin.container_spec import ContainerSpec
from rocshare_agent.load_check import container_hooks

CDI_VERSION = "0.6.0"
CDI_KIND = "rocshare.io/gpu"
PREPARED_ANNOTATION = "rocshare.io/prepared"
FILE_PREFIX = "rocshare.io-gpu_"
DEFAULT_CDI_DIR = "/var/run/cdi"


@dataclass(frozen=True)
class PreparedDevice:
    request: str
    pool: str
    device: str
    share_id: str | None
    slice: DeviceSlice


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]

    @property
    def cdi_device_id(self) -> str:
        return f"{CDI_KIND}={self.uid}"


def spec_path(cdi_dir: Path, claim_uid: str) -> Path:
    return cdi_dir / f"{FILE_PREFIX}{claim_uid}.json"


def cdi_spec(claim: PreparedClaim, spec: ContainerSpec, load_check_dir: str | None = None) -> dict:
    edits: dict = {"env": [f"{key}={value}" for key, value in spec.envs.items()],
                   "deviceNodes": [{"path": node.container_path, "hostPath": node.host_path,
                                    "permissions": node.permissions} for node in spec.devices]}
    if spec.mounts:
        edits["mounts"] = [{"hostPath": m.host_path, "containerPath": m.container_path,
                            "options": (["ro"] if m.read_only else []) + ["nosuid", "nodev", "bind"]}
                           for m in spec.mounts]
    hooks = container_hooks(spec, load_check_dir) if load_check_dir else []
    if hooks:  # the load check (load_check.py): refuses the container where the hook cannot load
        edits["hooks"] = hooks
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND,
            "annotations": {PREPARED_ANNOTATION: json.dumps(_record(claim), separators=(",", ":"), sort_keys=True)},
            "devices": [{"name": claim.uid, "containerEdits": edits}]}


def _record(claim: PreparedClaim) -> dict:
    return {"version": 1, "uid": claim.uid, "namespace": claim.namespace, "name": claim.name,
            "devices": [{"request": d.request, "pool": d.pool, "device": d.device, "shareID": d.share_id,
                         "slice": d.slice.to_json_dict()} for d in claim.devices]}


def write_spec(cdi_dir: Path, claim: PreparedClaim, spec: ContainerSpec, load_check_dir: str | None = None) -> Path:
    cdi_dir.mkdir(parents=True, exist_ok=True)
    target = spec_path(cdi_dir, claim.uid)
    temporary = target.with_suffix(".tmp")
    with open(temporary, "w") as file:
        json.dump(cdi_spec(claim, spec, load_check_dir), file, indent=1, sort_keys=True)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, target)
    return target


def remove_spec(cdi_dir: Path, claim_uid: str) -> bool:
    try:
        spec_path(cdi_dir, claim_uid).unlink()
    except FileNotFoundError:
        return False
    return True


def read_prepared(cdi_dir: Path) -> Iterator[PreparedClaim | str]:
    """Every claim recorded in the folder, or for a file that cannot be read, why (its CUs are then
    unknown: the caller must treat its GPUs as held, never as free)."""
    for path in sorted(cdi_dir.glob(f"{FILE_PREFIX}*.json")):
        try:
            yield decode_prepared(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError, ValidationError) as error:
            yield f"{path}: {error}"


def decode_prepared(spec: dict) -> PreparedClaim:
    record = json.loads(spec["annotations"][PREPARED_ANNOTATION])
    if record.get("version") != 1:
        raise ValueError(f"{PREPARED_ANNOTATION} has unsupported version {record.get('version')!r}")
    devices = tuple(PreparedDevice(request=d["request"], pool=d["pool"], device=d["device"], share_id=d.get("shareID"),
                                   slice=DeviceSlice.model_validate(d["slice"])) for d in record["devices"])
    return PreparedClaim(uid=record["uid"], namespace=record["namespace"], name=record["name"], devices=devices)
