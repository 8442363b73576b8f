"""The DRA kubelet plugin over its real unix sockets, called as the kubelet calls it: GetInfo and
NotifyRegistrationStatus on the registration socket, NodePrepareResources/NodeUnprepareResources
on the endpoint GetInfo names. Claims come from an in-memory API reply shaped as the API server
stores a claim allocated with consumable capacity (tests/e2e/dra has the real scheduler's); the
GPU is the Vega10 capture. Expected masks, limits and device nodes are worked out here."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import grpc
import pytest

from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationRecord, decode_record
from rocshare.api.models import HookMissing, Sharing
from rocshare.kube.client import Conflict, NotFound
from rocshare_agent.discovery import discover
from rocshare_agent.dra import dra_pb2 as pb
from rocshare_agent.dra import dra_pb2_grpc as pb_grpc
from rocshare_agent.dra import registration_pb2 as reg_pb
from rocshare_agent.dra import registration_pb2_grpc as reg_grpc
from rocshare_agent.dra.plugin import DraPluginService
from rocshare_agent.dra.server import plugin_socket, registration_socket, serve_dra_plugin
from tests.agent_fakes import hook_present

SYSFS = (Path(__file__).resolve().parents[3] / ".." / "shared" / "fixtures" / "sysfs").resolve()
NODE = "dra-node"
DEVICE = "gpu-c34ec50444dd0a6c"  # the Vega10 capture's unique_id, as a device name
MIB = 2**20


class Claims:
    """GET of resourceclaims, as the API server answers it."""

    def __init__(self) -> None:
        self.stored: dict[str, dict] = {}
        self.pods: dict[str, dict] = {}

    def reserve(self, name: str, *pods: dict) -> None:
        """Reserve the claim for `pods` (as kube-scheduler does), which the API server then lists."""
        stored = self.stored[f"/apis/resource.k8s.io/v1/namespaces/team/resourceclaims/{name}"]
        stored["status"]["reservedFor"] = [{"resource": "pods", "name": pod["metadata"]["name"],
                                            "uid": pod["metadata"]["uid"]} for pod in pods]
        self.pods.update({pod["metadata"]["name"]: pod for pod in pods})

    async def list(self, path: str, **query: str) -> dict:
        assert path == "/api/v1/namespaces/team/pods", path
        name = query["fieldSelector"].removeprefix("metadata.name=")
        return {"items": [self.pods[name]] if name in self.pods else []}

    def add(self, name: str, uid: str, *, cus: int | None, mib: int | None, share: str | None = "s") -> None:
        consumed = {}
        if cus is not None:
            consumed["compute"] = str(cus)
        if mib is not None:
            consumed["memory"] = f"{mib}Mi"
        result = {"request": "gpu", "driver": "gpu.rocshare.io", "pool": NODE, "device": DEVICE,
                  **({"shareID": f"{share}-{uid}", "consumedCapacity": consumed} if share else {})}
        self.stored[f"/apis/resource.k8s.io/v1/namespaces/team/resourceclaims/{name}"] = {
            "metadata": {"name": name, "namespace": "team", "uid": uid},
            "status": {"allocation": {"devices": {"results": [result]}}}}

    async def get(self, path: str) -> dict:
        if path not in self.stored:
            raise NotFound(404, "NotFound", path)
        return self.stored[path]

    async def merge_patch(self, path: str, patch: dict) -> dict:
        """Annotations only, with metadata.uid as the precondition the API server applies."""
        stored = await self.get(path)
        if patch["metadata"].get("uid", stored["metadata"]["uid"]) != stored["metadata"]["uid"]:
            raise Conflict(409, "Conflict", "uid precondition")
        stored["metadata"].setdefault("annotations", {}).update(patch["metadata"].get("annotations", {}))
        return stored

    def record(self, name: str) -> AllocationRecord:
        stored = self.stored[f"/apis/resource.k8s.io/v1/namespaces/team/resourceclaims/{name}"]
        return decode_record(stored["metadata"]["annotations"][ALLOCATION_ANNOTATION])


@pytest.fixture
async def plugin(tmp_path: Path):
    gpus = discover(SYSFS / "vega10-1gpu").gpus
    claims = Claims()
    dirs = {name: tmp_path / name for name in ("plugins", "registry", "cdi", "vgpu")}
    service = DraPluginService(kube=claims, node_name=NODE, inventory=lambda: (gpus, Sharing()), cdi_dir=dirs["cdi"],
                               hook_host_dir=str(dirs["vgpu"]), hook_missing=HookMissing.REFUSE,
                               hook_check=hook_present)
    task = asyncio.create_task(serve_dra_plugin(service, plugins_dir=dirs["plugins"], registry_dir=dirs["registry"]))
    for _ in range(100):
        if registration_socket(dirs["registry"]).exists():
            break
        await asyncio.sleep(0.05)
    try:
        yield claims, dirs, gpus
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def kubelet_registers(registry: Path) -> reg_pb.PluginInfo:
    async with grpc.aio.insecure_channel(f"unix://{registration_socket(registry)}") as channel:
        stub = reg_grpc.RegistrationStub(channel)
        info = await stub.GetInfo(reg_pb.InfoRequest())
        await stub.NotifyRegistrationStatus(reg_pb.RegistrationStatus(plugin_registered=True))
        return info


async def prepare(endpoint: str, *claims: tuple[str, str]) -> pb.NodePrepareResourcesResponse:
    async with grpc.aio.insecure_channel(f"unix://{endpoint}") as channel:
        return await pb_grpc.DRAPluginStub(channel).NodePrepareResources(pb.NodePrepareResourcesRequest(
            claims=[pb.Claim(namespace="team", name=name, uid=uid) for name, uid in claims]))


async def unprepare(endpoint: str, name: str, uid: str) -> pb.NodeUnprepareResourcesResponse:
    async with grpc.aio.insecure_channel(f"unix://{endpoint}") as channel:
        return await pb_grpc.DRAPluginStub(channel).NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(
            claims=[pb.Claim(namespace="team", name=name, uid=uid)]))


def edits(cdi_dir: Path, uid: str) -> tuple[dict[str, str], list[dict], list[dict]]:
    spec = json.loads((cdi_dir / f"rocshare.io-gpu_{uid}.json").read_text())
    assert spec["kind"] == "rocshare.io/gpu" and spec["cdiVersion"] == "0.6.0"
    [device] = spec["devices"]
    assert device["name"] == uid
    container = device["containerEdits"]
    env = dict(item.split("=", 1) for item in container["env"])
    return env, container["deviceNodes"], container.get("mounts", [])


async def test_registration_names_the_driver_and_its_endpoint(plugin):
    _claims, dirs, _gpus = plugin
    info = await kubelet_registers(dirs["registry"])
    assert info.type == "DRAPlugin" and info.name == "gpu.rocshare.io"
    assert info.endpoint == str(dirs["plugins"] / "gpu.rocshare.io" / "dra.sock") == str(plugin_socket(dirs["plugins"]))
    assert list(info.supported_versions) == ["v1.DRAPlugin"]
    assert Path(info.endpoint).stat().st_mode & 0o077 == 0  # owner-only


async def test_two_shares_get_disjoint_masks_and_unprepare_frees(plugin):
    claims, dirs, _gpus = plugin
    endpoint = str(plugin_socket(dirs["plugins"]))
    claims.add("a", "uid-a", cus=16, mib=4096)   # a quarter of the 64 CUs
    claims.add("b", "uid-b", cus=32, mib=8192)
    reply = await prepare(endpoint, ("a", "uid-a"), ("b", "uid-b"))
    assert {uid: r.error for uid, r in reply.claims.items()} == {"uid-a": "", "uid-b": ""}
    [device_a] = reply.claims["uid-a"].devices
    assert (device_a.pool_name, device_a.device_name, list(device_a.request_names)) == (NODE, DEVICE, ["gpu"])
    assert list(device_a.cdi_device_ids) == ["rocshare.io/gpu=uid-a"] and device_a.share_id == "s-uid-a"
    env_a, nodes_a, mounts_a = edits(dirs["cdi"], "uid-a")
    env_b, _nodes_b, _mounts_b = edits(dirs["cdi"], "uid-b")
    assert env_a["HSA_CU_MASK"] == "0:0-15" and env_b["HSA_CU_MASK"] == "0:16-47"
    # The record on each claim (what the operator counts) names the CUs the container got.
    [slice_a], [slice_b] = claims.record("a").containers[0].devices, claims.record("b").containers[0].devices
    assert (claims.record("a").node, slice_a.cu_ranges, slice_a.memory_mib) == (NODE, [(0, 15)], 4096)
    assert (slice_b.cu_ranges, slice_b.memory_mib) == ([(16, 47)], 8192)
    assert (slice_a.cores_pct, slice_b.cores_pct) == (25, 50)  # 16 and 32 of the Vega's 64 CUs
    assert env_a["HIP_DEVICE_MEMORY_LIMIT_0"] == "4096m" and env_b["HIP_DEVICE_MEMORY_LIMIT_0"] == "8192m"
    assert env_a["ROCR_VISIBLE_DEVICES"] == "GPU-c34ec50444dd0a6c" and env_a["HIP_VISIBLE_DEVICES"] == "0"
    assert env_a["LD_AUDIT"] == "/usr/local/vgpu/libamvgpu.so"
    assert mounts_a == [{"hostPath": str(dirs["vgpu"] / "libamvgpu.so"),
                         "containerPath": "/usr/local/vgpu/libamvgpu.so", "options": ["ro", "nosuid", "nodev", "bind"]}]
    assert nodes_a == [{"path": "/dev/kfd", "hostPath": "/dev/kfd", "permissions": "rw"},  # the capture has no DRM card
                       {"path": "/dev/dri/renderD128", "hostPath": "/dev/dri/renderD128", "permissions": "rw"}]

    # The kubelet retries a prepare it got no answer to: the same answer, nothing new held.
    again = await prepare(endpoint, ("a", "uid-a"))
    assert again.claims["uid-a"] == reply.claims["uid-a"]

    # 64 - 48 = 16 CUs left: a 17-CU share cannot be honoured; nothing is recorded for it.
    claims.add("c", "uid-c", cus=17, mib=1)
    refused = await prepare(endpoint, ("c", "uid-c"))
    assert refused.claims["uid-c"].error.startswith(
        "rocshare: ShareNotHonoured: device gpu-c34ec50444dd0a6c: no 17 free")
    assert not (dirs["cdi"] / "rocshare.io-gpu_uid-c.json").exists()

    assert (await unprepare(endpoint, "a", "uid-a")).claims["uid-a"].error == ""
    assert not (dirs["cdi"] / "rocshare.io-gpu_uid-a.json").exists()
    reply = await prepare(endpoint, ("c", "uid-c"))  # the freed 0-15 plus 48-63: 17 CUs fit now
    assert reply.claims["uid-c"].error == ""
    env_c, _, _ = edits(dirs["cdi"], "uid-c")
    assert env_c["HSA_CU_MASK"] == "0:0-15,48"  # largest gap first when no single gap holds it


def pod_naming(name: str, claim: str, *containers: str) -> dict:
    return {"metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}"},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                     "containers": [{"name": c, "resources": {"claims": [{"name": "gpu"}]}} for c in containers]}}


async def test_a_claim_serves_one_container_of_one_pod(plugin):
    """Each consumer would get the claim's whole memory limit through its one CDI device (issue 39)."""
    claims, dirs, _gpus = plugin
    endpoint = str(plugin_socket(dirs["plugins"]))
    claims.add("pods", "uid-pods", cus=16, mib=4096)
    claims.reserve("pods", pod_naming("p1", "pods", "main"), pod_naming("p2", "pods", "main"))
    claims.add("containers", "uid-containers", cus=16, mib=4096)
    claims.reserve("containers", pod_naming("p3", "containers", "main", "side"))
    claims.add("one", "uid-one", cus=16, mib=4096)
    claims.reserve("one", pod_naming("p4", "one", "main"))
    reply = await prepare(endpoint, ("pods", "uid-pods"), ("containers", "uid-containers"), ("one", "uid-one"))
    assert reply.claims["uid-pods"].error == (
        "rocshare: ClaimSharedByConsumers: claim team/pods is reserved for 2 consumers (p1, p2); a claim of "
        "gpu.rocshare.io serves one pod: give each its own claim (a ResourceClaimTemplate)")
    assert reply.claims["uid-containers"].error.startswith(
        "rocshare: ClaimSharedByConsumers: claim team/containers is named by 2 containers of pod p3 (main, side)")
    assert not (dirs["cdi"] / "rocshare.io-gpu_uid-pods.json").exists()
    assert not (dirs["cdi"] / "rocshare.io-gpu_uid-containers.json").exists()
    assert reply.claims["uid-one"].error == "" and (dirs["cdi"] / "rocshare.io-gpu_uid-one.json").exists()


async def test_a_restarted_plugin_keeps_what_was_prepared(plugin, tmp_path):
    claims, dirs, gpus = plugin
    endpoint = str(plugin_socket(dirs["plugins"]))
    claims.add("a", "uid-a", cus=60, mib=1024)
    assert (await prepare(endpoint, ("a", "uid-a"))).claims["uid-a"].error == ""
    # A second service on the same CDI folder (the agent restarted): it reads the record back.
    fresh = DraPluginService(kube=claims, node_name=NODE, inventory=lambda: (gpus, Sharing()), cdi_dir=dirs["cdi"],
                             hook_host_dir=str(dirs["vgpu"]), hook_check=hook_present)
    claims.add("b", "uid-b", cus=8, mib=1024)
    reply = await fresh.node_prepare_resources(pb.NodePrepareResourcesRequest(
        claims=[pb.Claim(namespace="team", name="b", uid="uid-b")]))
    assert "no 8 free CUs" in reply.claims["uid-b"].error  # 4 are left, 0-59 held by the first life's claim


async def test_whole_gpu_gets_no_mask_no_limit_and_unallocated_claims_are_refused(plugin):
    claims, dirs, _gpus = plugin
    endpoint = str(plugin_socket(dirs["plugins"]))
    claims.add("whole", "uid-w", cus=64, mib=16368)  # every capacity's default: the whole GPU
    reply = await prepare(endpoint, ("whole", "uid-w"), ("ghost", "uid-g"))
    assert reply.claims["uid-w"].error == ""
    env, _, mounts = edits(dirs["cdi"], "uid-w")
    assert "HSA_CU_MASK" not in env and "LD_AUDIT" not in env and mounts == []
    assert not any(key.startswith("HIP_DEVICE_MEMORY_LIMIT") for key in env)
    assert reply.claims["uid-g"].error == "rocshare: ClaimNotAllocated: claim team/ghost does not exist"


async def test_a_socket_path_too_long_for_unix_addresses_is_refused_by_name(tmp_path):
    from rocshare_agent.deviceplugin.server import start_owner_only

    deep = tmp_path / ("d" * 120) / "dra.sock"  # a unix socket's path holds at most 107 bytes
    with pytest.raises(ValueError, match="longer than a unix socket address holds"):
        await start_owner_only(grpc.aio.server(), deep)


async def test_a_cdi_folder_that_cannot_be_written_fails_the_prepare_with_why(plugin):
    claims, dirs, _gpus = plugin
    dirs["cdi"].parent.mkdir(parents=True, exist_ok=True)
    dirs["cdi"].write_text("not a folder")  # the CDI folder path is taken by a file
    claims.add("a", "uid-a", cus=8, mib=1024)
    reply = await prepare(str(plugin_socket(dirs["plugins"])), ("a", "uid-a"))
    assert reply.claims["uid-a"].error.startswith(f"rocshare: CDI folder {dirs['cdi']}: ")
    assert list(reply.claims["uid-a"].devices) == []


async def test_a_claim_gets_one_account_folder_mounted_in_its_cdi_spec(tmp_path):
    """docs/container-account.md: prepare makes claims/<uid>/ with the slice's limits, and the CDI spec
    (what every consumer of the claim receives) binds its usage read-write and its slice read-only;
    unprepare removes the folder."""
    from rocshare.api.container_account import USAGE_FILE
    from rocshare_agent.accounts import AccountStore

    gpus = discover(SYSFS / "vega10-1gpu").gpus
    claims = Claims()
    claims.add("a", "uid-a", cus=16, mib=4096)
    service = DraPluginService(kube=claims, node_name=NODE, inventory=lambda: (gpus, Sharing()),
                               cdi_dir=tmp_path / "cdi", hook_host_dir=str(tmp_path / "vgpu"),
                               hook_missing=HookMissing.REFUSE, hook_check=hook_present,
                               accounts=AccountStore(tmp_path / "accounts"))
    reply = await service.node_prepare_resources(pb.NodePrepareResourcesRequest(
        claims=[pb.Claim(namespace="team", name="a", uid="uid-a")]))
    assert reply.claims["uid-a"].error == ""
    env, _nodes, mounts = edits(tmp_path / "cdi", "uid-a")
    folder = tmp_path / "accounts" / "claims" / "uid-a"
    assert {m["containerPath"]: (m["hostPath"], m["options"]) for m in mounts if "account" in m["containerPath"]
            or "slice" in m["containerPath"]} == {
        "/usr/local/vgpu/account": (str(folder / "usage"), ["nosuid", "nodev", "bind"]),
        "/usr/local/vgpu/slice": (str(folder / "slice"), ["ro", "nosuid", "nodev", "bind"])}
    assert env["ROCSHARE_ACCOUNT_DIR"] == "/usr/local/vgpu/account"
    assert env["ROCSHARE_SLICE_DIR"] == "/usr/local/vgpu/slice"
    assert (folder / "slice" / "limits").read_text() == (
        f"rocshare-limits 1\ngeneration 1\nmemory 0 {4096 * 1024 * 1024}\ncu-mask 0 0-15\n")
    (folder / "usage" / USAGE_FILE).write_bytes(b"")  # what a consumer's hook would have made
    await service.node_unprepare_resources(pb.NodeUnprepareResourcesRequest(
        claims=[pb.Claim(namespace="team", name="a", uid="uid-a")]))
    assert not folder.exists()
