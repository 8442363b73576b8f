"""The DRA kubelet plugin's handlers: NodePrepareResources and NodeUnprepareResources.

Plain async methods (STYLE.md 6), bound to gRPC in dra/server.py. Prepare reads each claim's
allocation from the API server (the kubelet sends only namespace, name and uid), keeps the
results of this driver in this node's pool, plans the CU ranges with the core rule
(rocshare.core.dra_shares) beside what the node's prepared claims hold, renders what the
container receives with the device plugin's own renderer (deviceplugin/container_spec.py) and
writes it as a CDI spec (dra/cdi.py), whose ID it returns.

Invariants: prepares and unprepares run one at a time (the holdings they read are the ones they
change); a claim already prepared answers from its record, unchanged (the kubelet retries, and
an agent restarted mid-prepare finds its file); nothing is recorded for a claim that fails, and
its error names the reason word; an unreadable record in the CDI folder stops every prepare
(its CUs are unknown, so none can be proven free) until it is removed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rocshare.api import dra
from rocshare.api.container_account import file_generation, limits_for
from rocshare.api.allocation import ALLOCATION_ANNOTATION, AllocationRecord, ContainerAllocation, encode_record
from rocshare.api.gfx import effective_memory_scaling
from rocshare.api.models import GpuInfo, HookMissing, Sharing
from rocshare.core.dra_shares import AllocatedDevice, Holdings, ShareError, plan_claim
from rocshare.core.inventory import GpuSpec
from rocshare.core.resource_slices import specs_by_device
from rocshare.kube.client import ApiError, Kube, NotFound, object_path
from rocshare_agent.accounts import AccountStore
from rocshare_agent.deviceplugin.container_spec import AccountFolders, SpecError, render_container
from rocshare_agent.dra import cdi
from rocshare_agent.dra import dra_pb2 as pb
from rocshare_agent.hook import HookCheck, check_hook, missing_message
from rocshare_agent.load_check import DEFAULT_LOAD_CHECK_DIR

log = logging.getLogger(__name__)

NOT_ALLOCATED_REASON = "ClaimNotAllocated"
LEDGER_REASON = "PreparedRecordUnreadable"
HOOK_REASON = "MemoryHookMissing"
SHARED_REASON = "ClaimSharedByConsumers"
ACCOUNT_REASON = "AccountFolderUnusable"

Inventory = Callable[[], tuple[Sequence[GpuInfo], Sharing] | None]
"""What the node's ResourceSlice offers now (SlicePublisher.offered): GPUs and pool settings."""


class PrepareError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")


class DraPluginService:
    def __init__(self, *, kube: Kube, node_name: str, inventory: Inventory, cdi_dir: Path, hook_host_dir: str,
                 hook_missing: HookMissing = HookMissing.REFUSE, dev_root: str = "/dev",
                 hook_check: Callable[[str], HookCheck] = check_hook,
                 load_check_dir: str = DEFAULT_LOAD_CHECK_DIR, accounts: AccountStore | None = None) -> None:
        self.kube, self.node_name, self.inventory = kube, node_name, inventory
        self.load_check_dir = load_check_dir  # a slice's CDI spec runs the check from here (load_check.py)
        self.cdi_dir = Path(cdi_dir)
        self.hook_host_dir, self.hook_missing, self.dev_root = hook_host_dir, hook_missing, dev_root
        self.hook_check = hook_check
        self.accounts = accounts  # the claim's account folder (accounts.py); None: the hook's /tmp
        self._lock = asyncio.Lock()

    async def node_prepare_resources(self, request: pb.NodePrepareResourcesRequest) -> pb.NodePrepareResourcesResponse:
        response = pb.NodePrepareResourcesResponse()
        async with self._lock:
            for claim in request.claims:
                response.claims[claim.uid].CopyFrom(await self._prepare_one(claim))
        return response

    async def node_unprepare_resources(self, request: pb.NodeUnprepareResourcesRequest
                                       ) -> pb.NodeUnprepareResourcesResponse:
        response = pb.NodeUnprepareResourcesResponse()
        async with self._lock:
            for claim in request.claims:
                try:
                    removed = cdi.remove_spec(self.cdi_dir, claim.uid)
                    if self.accounts is not None:
                        self.accounts.remove_claim(claim.uid)
                except OSError as error:  # the kubelet calls again; the claim's CUs stay held meanwhile
                    response.claims[claim.uid].CopyFrom(pb.NodeUnprepareResourceResponse(
                        error=f"rocshare: cannot remove the claim's CDI spec: {error}"))
                    continue
                log.info("unprepared claim %s/%s (%s)%s", claim.namespace, claim.name, claim.uid,
                         "" if removed else ": nothing was prepared")
                response.claims[claim.uid].CopyFrom(pb.NodeUnprepareResourceResponse())
        return response

    async def _prepare_one(self, claim: pb.Claim) -> pb.NodePrepareResourceResponse:
        try:
            prepared = await self._prepared_or_new(claim)
        except (PrepareError, ShareError, SpecError) as error:
            log.warning("prepare of claim %s/%s refused: %s", claim.namespace, claim.name, error)
            return pb.NodePrepareResourceResponse(error=f"rocshare: {error}")
        except ApiError as error:
            return pb.NodePrepareResourceResponse(error=f"rocshare: API server: {error}")
        except OSError as error:  # the CDI folder cannot be read or written: nothing was recorded
            log.error("prepare of claim %s/%s: CDI folder %s: %s", claim.namespace, claim.name, self.cdi_dir, error)
            return pb.NodePrepareResourceResponse(error=f"rocshare: CDI folder {self.cdi_dir}: {error}")
        return pb.NodePrepareResourceResponse(devices=_devices(prepared))

    async def _prepared_or_new(self, claim: pb.Claim) -> cdi.PreparedClaim:
        records = list(cdi.read_prepared(self.cdi_dir))
        unreadable = [record for record in records if isinstance(record, str)]
        if unreadable:
            raise PrepareError(LEDGER_REASON, f"{unreadable[0]}; the CUs it holds are unknown, so no share can be "
                                              f"proven free until it is removed")
        existing = next((record for record in records if record.uid == claim.uid), None)
        if existing is not None:
            await self._record_on_claim(existing)  # a retry: the first try may not have written it
            return existing
        allocated = await self._allocated(claim)
        gpus, sharing = self._offered()
        specs = _specs_by_device(gpus, sharing, self.node_name)
        cu_counts = {spec.gpu_id: spec.cu_count for spec in specs.values()}
        holdings = Holdings.of((d.slice for record in records for d in record.devices), cu_counts)
        slices = plan_claim(allocated, specs, holdings)
        prepared = cdi.PreparedClaim(uid=claim.uid, namespace=claim.namespace, name=claim.name, devices=tuple(
            cdi.PreparedDevice(request=a.request, pool=self.node_name, device=a.device, share_id=a.share_id, slice=s)
            for a, s in zip(allocated, slices)))
        container = ContainerAllocation(name=claim.name, devices=slices)
        memory_hook = self._memory_hook(container)
        spec = render_container(container, {gpu.id: gpu for gpu in gpus}, oversubscribed=_oversubscribed(gpus, sharing),
                                hook_host_dir=self.hook_host_dir, memory_hook=memory_hook,
                                dev_root=self.dev_root, account=self._account_for(claim.uid, container, memory_hook))
        cdi.write_spec(self.cdi_dir, prepared, spec, self.load_check_dir)
        await self._record_on_claim(prepared)
        log.info("prepared claim %s/%s (%s): %s", claim.namespace, claim.name, claim.uid,
                 "; ".join(f"{d.device} {d.slice.memory_mib} MiB CUs {d.slice.cu_ranges or 'all'}"
                           for d in prepared.devices))
        return prepared

    async def _record_on_claim(self, prepared: cdi.PreparedClaim) -> None:
        """Write what the claim was handed out (its CU ranges) on the claim, for the operator's
        accounting (rocshare.core.dra_shares.claim_record). The node's CDI record is what holds the
        CUs; without this write the operator counts the claim from its allocation (same memory and
        cores, CU positions unknown), so a failure is logged, not fatal."""
        record = AllocationRecord(node=self.node_name, containers=[
            ContainerAllocation(name=prepared.name, devices=[device.slice for device in prepared.devices])])
        path = object_path(dra.RESOURCE_API_VERSION, "resourceclaims", prepared.name, namespace=prepared.namespace)
        try:
            await self.kube.merge_patch(path, {"metadata": {
                "uid": prepared.uid, "annotations": {ALLOCATION_ANNOTATION: encode_record(record)}}})
        except ApiError as error:
            log.warning("claim %s/%s: could not write its record (%s); the operator counts it from its allocation",
                        prepared.namespace, prepared.name, error)

    async def _allocated(self, claim: pb.Claim) -> list[AllocatedDevice]:
        path = object_path(dra.RESOURCE_API_VERSION, "resourceclaims", claim.name, namespace=claim.namespace)
        try:
            stored = await self.kube.get(path)
        except NotFound:
            raise PrepareError(NOT_ALLOCATED_REASON, f"claim {claim.namespace}/{claim.name} does not exist") from None
        if stored["metadata"].get("uid") != claim.uid:
            raise PrepareError(NOT_ALLOCATED_REASON, f"claim {claim.namespace}/{claim.name} is not uid {claim.uid}")
        await self._one_consumer(stored)
        results = ((stored.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
        ours = [AllocatedDevice.from_result(r) for r in results
                if r.get("driver") == dra.DRIVER_NAME and r.get("pool") == self.node_name]
        if not ours:
            raise PrepareError(NOT_ALLOCATED_REASON, f"claim {claim.namespace}/{claim.name} has no device of "
                                                     f"{dra.DRIVER_NAME} allocated on node {self.node_name}")
        return ours

    async def _one_consumer(self, stored: Mapping) -> None:
        """A claim serves one container of one pod (docs/dra.md "One claim, one container"): each
        consumer would get the claim's one CDI device, its memory limit and an account of its own.
        Raises PrepareError when it is reserved for several, or several containers of its pod name it."""
        where = f"claim {stored['metadata'].get('namespace')}/{stored['metadata'].get('name')}"
        reserved = (stored.get("status") or {}).get("reservedFor") or []
        if len(reserved) > 1:
            raise PrepareError(SHARED_REASON, f"{where} is reserved for {len(reserved)} consumers "
                               f"({', '.join(str(r.get('name')) for r in reserved)}); a claim of {dra.DRIVER_NAME} "
                               f"serves one pod: give each its own claim (a ResourceClaimTemplate)")
        pods = [r for r in reserved if r.get("resource") == "pods" and not r.get("apiGroup")]
        if not pods:
            return
        listed = await self.kube.list(object_path("v1", "pods", namespace=stored["metadata"].get("namespace")),
                                      fieldSelector=f"metadata.name={pods[0].get('name')}")
        pod = next((item for item in listed.get("items") or () if item["metadata"].get("uid") == pods[0].get("uid")),
                   None)
        if pod is None:
            return  # gone: the kubelet will not start its containers
        names = _containers_naming(pod, str(stored["metadata"].get("name")))
        if len(names) > 1:
            raise PrepareError(SHARED_REASON, f"{where} is named by {len(names)} containers of pod "
                               f"{pod['metadata'].get('name')} ({', '.join(names)}); each would get the claim's whole "
                               f"memory limit: give each container its own claim")

    def _offered(self) -> tuple[Sequence[GpuInfo], Sharing]:
        offered = self.inventory()
        if offered is None:
            raise PrepareError(NOT_ALLOCATED_REASON, "the node has not published its devices yet")
        return offered

    def _account_for(self, claim_uid: str, container: ContainerAllocation, memory_hook: bool) -> AccountFolders | None:
        """The claim's account folder (one per claim, whoever consumes it) with its limits written."""
        if self.accounts is None or not memory_hook or all(device.whole for device in container.devices):
            return None
        try:
            return self.accounts.prepare(self.accounts.claim_folder(claim_uid),
                                         limits_for(container.devices, generation=file_generation(0)))
        except (OSError, ValueError) as error:
            raise PrepareError(ACCOUNT_REASON, f"cannot make the claim's account folder: {error}") from None

    def forget_unprepared_accounts(self) -> None:
        """Remove account folders of claims this node no longer has prepared."""
        if self.accounts is None:
            return
        try:
            prepared = [record.uid for record in cdi.read_prepared(self.cdi_dir) if not isinstance(record, str)]
        except OSError as error:
            log.warning("accounts: cannot read the prepared claims in %s: %s", self.cdi_dir, error)
            return
        gone = self.accounts.remove_claims_except(prepared)
        if gone:
            log.info("removed the account folders of %d unprepared claims", len(gone))

    def _memory_hook(self, container: ContainerAllocation) -> bool:
        if all(device.whole for device in container.devices):
            return True
        check = self.hook_check(self.hook_host_dir)
        if check.present:
            return True
        if self.hook_missing == HookMissing.REFUSE:
            raise PrepareError(HOOK_REASON, missing_message(check, node=self.node_name))
        log.warning("claim %s: the memory hook is missing; the share runs without a memory limit", container.name)
        return False


def _containers_naming(pod: Mapping, claim_name: str) -> list[str]:
    """The containers (init and app) of `pod` whose resources.claims name the pod claim that is `claim_name`."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    pod_claims = {entry.get("name") for entry in spec.get("resourceClaims") or ()
                  if entry.get("resourceClaimName") == claim_name}
    pod_claims |= {entry.get("name") for entry in status.get("resourceClaimStatuses") or ()
                   if entry.get("resourceClaimName") == claim_name}
    return [container.get("name", "") for kind in ("initContainers", "containers") for container in spec.get(kind) or ()
            if any(ref.get("name") in pod_claims for ref in (container.get("resources") or {}).get("claims") or ())]


def _specs_by_device(gpus: Sequence[GpuInfo], sharing: Sharing, node_name: str) -> Mapping[str, GpuSpec]:
    return {name: spec for name, spec in specs_by_device(node_name, gpus, sharing).items() if spec.healthy}


def _oversubscribed(gpus: Sequence[GpuInfo], sharing: Sharing) -> bool:
    return any(effective_memory_scaling(gpu.gfx_target_version, sharing.device_memory_scaling) > 1.0 for gpu in gpus)


def _devices(prepared: cdi.PreparedClaim) -> list[pb.Device]:
    # One CDI device carries the whole claim's edits (HSA_CU_MASK and the memory limits are per
    # container, indexed by GPU position): it rides on the claim's first device only, so a
    # runtime never injects it twice.
    return [pb.Device(request_names=[d.request], pool_name=d.pool, device_name=d.device,
                      cdi_device_ids=[prepared.cdi_device_id] if position == 0 else [],
                      **({"share_id": d.share_id} if d.share_id else {}))
            for position, d in enumerate(prepared.devices)]
