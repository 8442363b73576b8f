"""The shapes of rocshare's custom resources (group rocshare.io, version v1alpha1).

These pydantic models are the one source of truth: `rocshare crds` generates the
CRD YAML in crds/ from them, and a unit test proves the committed files agree.
Field descriptions become `kubectl explain` text. JSON names are camelCase, as
Kubernetes objects are; Python names carry units (``vram_mib``, ``cores_pct``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rocshare.api.gfx import is_cdna

GROUP = "rocshare.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)

    def to_json_dict(self) -> dict:
        """The object as the API server stores it: camelCase, no unset optionals."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class OperatingMode(StrEnum):
    CU = "cu"
    PARTITION = "partition"


class ResourceNaming(StrEnum):
    """How devices are named as extended resources (see rocshare.api.resource_names)."""

    SINGLE = "single"
    MIXED = "mixed"


class OmittedCores(StrEnum):
    """What a slice that omits amd.com/gpucores reserves of its GPU's compute."""

    EXCLUSIVE = "Exclusive"
    SHARED = "Shared"


class CuLayout(StrEnum):
    """How a slice's CU mask bits are chosen (rocshare.core.cu_layout)."""

    ISOLATED = "Isolated"
    """Whole XCDs, then whole shader engines, then shader arrays, then single CUs, by where the kernel puts each bit."""
    PACKED = "Packed"
    """Contiguous bit ranges (which the kernel spreads over every XCD and engine)."""


class NodePolicy(StrEnum):
    BINPACK = "binpack"
    SPREAD = "spread"
    BESTFIT = "bestfit"
    """The FGD paper's BestFit: the node left with the least CPU and GPU free (both against the largest node's)."""


class GpuPolicy(StrEnum):
    BINPACK = "binpack"
    SPREAD = "spread"
    TOPOLOGY_AWARE = "topology-aware"
    FRAGMENTATION_AWARE = "fragmentation-aware"


class HookMissing(StrEnum):
    """What a memory slice gets on a node whose hook library (agent.hookPath) is missing."""

    REFUSE = "Refuse"
    RUN_WITHOUT_LIMIT = "RunWithoutLimit"


class HookLibrary(StrEnum):
    """Whose memory hook a pool's nodes use: rocshare's own, installed by the agent, or one the admin installs."""

    ROCSHARE = "Rocshare"
    EXTERNAL = "External"


class AgentInterface(StrEnum):
    """How a pool's nodes offer their GPUs to the kubelet: never both on one node."""

    DEVICE_PLUGIN = "DevicePlugin"
    DRA = "DRA"


class HealthSourceKind(StrEnum):
    DEVICE_FILES = "deviceFiles"
    METRICS_EXPORTER = "metricsExporter"


class Condition(_Model):
    """One observation of the object's state, as Kubernetes conditions are: type, status, reason, message."""

    type: str = Field(description="Condition type, e.g. Ready or Degraded.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="One CamelCase word saying why.")
    message: str = Field(default="", description="Human-readable detail.")
    last_transition_time: str | None = Field(
        default=None, alias="lastTransitionTime", description="RFC 3339 time the status last changed."
    )
    observed_generation: int | None = Field(
        default=None, alias="observedGeneration", ge=0, description="metadata.generation this condition was computed from."
    )


# ---- AmdGpuPool ---------------------------------------------------------------------------


class Sharing(_Model):
    split_count: int = Field(
        default=0, alias="splitCount", ge=0, le=64,
        description="How many pods may share one GPU. 0 = automatic: 10, or 2 on gfx12 (RDNA4).",
    )
    device_memory_scaling: float = Field(
        default=1.0, alias="deviceMemoryScaling", ge=1.0, le=4.0,
        description="Register this many times the real VRAM (1.0-4.0) on GPUs that can oversubscribe (CDNA and other gfx9). "
                    "Above 1.0 their slices get HIP_OVERSUBSCRIBE=true and HSA_XNACK=1. RDNA GPUs (no XNACK) register their real VRAM.",
    )
    operating_mode: OperatingMode = Field(
        default=OperatingMode.CU, alias="operatingMode",
        description="cu: GPUs are sliced by memory and CU mask. partition: each compute partition is one whole, unshared device.",
    )
    resource_naming: ResourceNaming = Field(
        default=ResourceNaming.SINGLE, alias="resourceNaming",
        description="single: every device is amd.com/gpu. mixed (partition mode): each partition is offered as "
                    "amd.com/<compute>_<memory> of its mode, e.g. amd.com/cpx_nps4, as AMD's device plugin names them.",
    )
    omitted_cores: OmittedCores = Field(
        default=OmittedCores.EXCLUSIVE, alias="omittedCores",
        description="A slice without amd.com/gpucores gets every CU. Exclusive: it also reserves the GPU's whole compute range. Shared: it reserves none.",
    )
    cu_layout: CuLayout | None = Field(
        default=None, alias="cuLayout",
        description="How a slice's CUs are laid out. Isolated: whole XCDs, then whole shader engines, then shader "
                    "arrays, then single CUs, so co-tenants share as few XCDs (L2) and engines as they can. Packed: "
                    "contiguous mask ranges, which the kernel deals over every XCD and engine. Unset: Isolated on "
                    "CDNA (MI100 and later Instinct), Packed on others (RDNA, GCN).",
    )

    def layout_for(self, gfx_target_version: int) -> CuLayout:
        """The layout a GPU of this pool gets: the pool's, or by default Isolated on CDNA and Packed on others."""
        if self.cu_layout is not None:
            return self.cu_layout
        return CuLayout.ISOLATED if is_cdna(gfx_target_version) else CuLayout.PACKED


class Scheduling(_Model):
    node_policy: NodePolicy = Field(
        default=NodePolicy.BINPACK, alias="nodePolicy", description="How nodes are ranked: binpack, spread or bestfit (the node left with the least CPU and GPU free)."
    )
    gpu_policy: GpuPolicy = Field(
        default=GpuPolicy.BINPACK, alias="gpuPolicy",
        description="How GPUs on a node are chosen: binpack, spread, topology-aware or fragmentation-aware.",
    )


class HealthSource(_Model):
    kind: HealthSourceKind = Field(
        default=HealthSourceKind.DEVICE_FILES,
        description="deviceFiles: a GPU whose /dev node cannot be opened is unhealthy. metricsExporter: also read gpu_health from the AMD Device Metrics Exporter.",
    )
    exporter_url: str | None = Field(
        default=None, alias="exporterURL", pattern=r"^https?://",
        description="Metrics exporter URL, e.g. http://localhost:5000/metrics (metricsExporter only).",
    )
    interval_seconds: int = Field(
        default=10, alias="intervalSeconds", ge=1, le=3600, description="How often health is checked."
    )


class AgentSettings(_Model):
    interface: AgentInterface = Field(
        default=AgentInterface.DEVICE_PLUGIN,
        description="How the nodes offer their GPUs. DevicePlugin: amd.com/gpu through the kubelet's device plugin API, "
                    "placed by rocshare's scheduler extender. DRA: a ResourceSlice per node for the DRA driver "
                    "gpu.rocshare.io (DeviceClass gpu.rocshare.io), placed by kube-scheduler itself; needs "
                    "Kubernetes 1.36+ (DRAConsumableCapacity) and a container runtime with CDI. A node serves one or "
                    "the other, never both.",
    )
    image: str = Field(default="rocshare/node-agent:0.1.0", min_length=1, description="Node agent container image.")
    sysfs_root: str = Field(default="/sys", alias="sysfsRoot", description="Host path of sysfs.")
    dev_root: str = Field(default="/dev", alias="devRoot", description="Host path of /dev.")
    device_plugin_dir: str = Field(
        default="/var/lib/kubelet/device-plugins", alias="devicePluginDir",
        description="Host folder holding kubelet.sock.",
    )
    hook_path: str = Field(
        default="/usr/local/vgpu", alias="hookPath",
        description="Host folder holding libamvgpu.so, mounted read-only into slice containers.",
    )
    hook_library: HookLibrary = Field(
        default=HookLibrary.ROCSHARE, alias="hookLibrary",
        description="Which memory hook slice containers load. Rocshare: the agent installs rocshare's own hook, "
                    "shipped in its image, into hookPath before it offers slices (a versioned file, "
                    "libamvgpu.so linked to it). External: the admin installs an LD_AUDIT library with the "
                    "same contract there (e.g. HAMi's libamvgpu.so); the agent only verifies it. Either way "
                    "the agent checks that the file is an audit library for the node (the MemoryHook condition).",
    )
    hook_missing: HookMissing = Field(
        default=HookMissing.REFUSE, alias="hookMissing",
        description="When libamvgpu.so is missing or not an audit library for the node, a memory slice there is refused "
                    "(Refuse: the kubelet's Allocate fails naming the file) or runs with no memory limit, "
                    "said in a Warning event on the pod (RunWithoutLimit). Whole-GPU pods never need the hook.",
    )
    group_file: str = Field(
        default="/etc/group", alias="groupFile",
        description="Host group file, read for the video and render group ids the agent publishes.")
    pod_device_dir: str = Field(
        default="/var/lib/rocshare/pod-devices", alias="podDeviceDir",
        description="Host folder where the agent makes per-pod device files a non-root container can open.")
    priority_class_name: str | None = Field(default=None, alias="priorityClassName", description="PriorityClass of the agent pods.")
    tolerations: list[dict[str, str]] = Field(default_factory=list, description="Extra tolerations for the agent pods.")


class AmdGpuPoolSpec(_Model):
    """Which nodes the pool holds and how their GPUs are shared, placed, health-checked and served."""

    node_selector: dict[str, str] = Field(
        alias="nodeSelector", description="Label selector (matchLabels form) choosing the pool's nodes."
    )
    sharing: Sharing = Field(default_factory=Sharing, description="How the pool's GPUs are shared.")
    scheduling: Scheduling = Field(default_factory=Scheduling, description="Default placement policies.")
    runtime_class_name: str | None = Field(
        default=None, alias="runtimeClassName", description="RuntimeClass set on pods that name none."
    )
    health: HealthSource = Field(default_factory=HealthSource, description="Where GPU health comes from.")
    agent: AgentSettings = Field(default_factory=AgentSettings, description="Node agent DaemonSet settings.")


class AmdGpuPoolStatus(_Model):
    """The pool's nodes and GPUs summed by the operator, with its Ready and Degraded conditions."""

    nodes: int = Field(default=0, ge=0, description="Nodes in the pool.")
    gpus_total: int = Field(default=0, alias="gpusTotal", ge=0, description="GPUs (or partitions) in the pool.")
    gpus_healthy: int = Field(default=0, alias="gpusHealthy", ge=0, description="Healthy GPUs.")
    vram_total_mib: int = Field(default=0, alias="vramTotalMiB", ge=0, description="VRAM in the pool, MiB.")
    vram_allocated_mib: int = Field(default=0, alias="vramAllocatedMiB", ge=0, description="VRAM given to pods, MiB.")
    cores_allocated_pct: int = Field(
        default=0, alias="coresAllocatedPercent", ge=0, description="Compute given to pods, percent of one GPU (250 = 2.5 GPUs)."
    )
    conflicting_nodes: list[str] = Field(
        default_factory=list, alias="conflictingNodes", description="Nodes this pool selects that an older pool holds."
    )
    observed_generation: int | None = Field(default=None, alias="observedGeneration", ge=0, description="Last spec generation acted on.")
    conditions: list[Condition] = Field(default_factory=list, description="Ready and Degraded.")


# ---- AmdGpuNode ---------------------------------------------------------------------------


class Partition(_Model):
    compute_mode: str = Field(alias="computeMode", description="Compute partition mode: spx, dpx, tpx, qpx or cpx.")
    memory_mode: str | None = Field(default=None, alias="memoryMode", description="Memory partition mode: nps1, nps4 ...")
    index: int = Field(ge=0, description="Partition index inside its physical GPU.")
    parent_bdf: str = Field(alias="parentBDF", description="PCI address of the physical GPU.")


class CuTopologyInfo(_Model):
    """The GPU's compute structure from its KFD node's properties: what the kernel deals a CU mask over."""

    num_xcc: int = Field(default=1, alias="numXCC", ge=1, le=64, description="XCCs (XCDs) of the device (num_xcc).")
    array_count: int = Field(alias="arrayCount", ge=1, description="Shader arrays (array_count).")
    simd_arrays_per_engine: int = Field(alias="simdArraysPerEngine", ge=1,
                                        description="Shader arrays per shader engine (simd_arrays_per_engine).")
    cu_per_simd_array: int = Field(alias="cuPerSimdArray", ge=1,
                                   description="CUs per shader array, fused-off ones included (cu_per_simd_array).")


class GpuInfo(_Model):
    """One GPU, or one compute partition of a GPU, as the node agent found it."""

    id: str = Field(min_length=1, description="Stable id: GPU-<16 hex digits of unique_id>, or derived from the PCI address.")
    index: int = Field(ge=0, description="Position among the node's GPUs (KFD order).")
    render_minor: int | None = Field(default=None, alias="renderMinor", ge=0, description="N of /dev/dri/renderD<N>.")
    card: int | None = Field(default=None, ge=0, description="N of /dev/dri/card<N>.")
    product: str = Field(default="", description="Product name (empty on some Radeon boards).")
    resource: str = Field(
        default="amd.com/gpu", description="The extended resource it is offered under: amd.com/gpu, or its partition "
                                           "kind (amd.com/cpx_nps4 ...) on a pool with mixed resource naming.")
    device_id: str = Field(default="", alias="deviceId", description="PCI device id, hex (e.g. 0x740f).")
    gfx_target_version: int = Field(alias="gfxTargetVersion", ge=0, description="major*10000+minor*100+stepping, e.g. 90402 = gfx942.")
    vram_mib: int | None = Field(default=None, alias="vramMiB", ge=0, description="VRAM in MiB, null when no source has it.")
    cu_count: int = Field(alias="cuCount", ge=0, description="Active compute units.")
    cu_per_wgp: int = Field(default=1, alias="cuPerWGP", ge=1, description="CUs per workgroup processor: 2 on RDNA, 1 on CDNA/GCN.")
    pci_bdf: str = Field(alias="pciBDF", description="PCI address domain:bus:device.function.")
    numa: int | None = Field(default=None, description="NUMA node, null when unknown.")
    hive_id: str | None = Field(default=None, alias="hiveId", description="XGMI hive id (hex), null when not in a hive.")
    xgmi_peers: list[str] = Field(default_factory=list, alias="xgmiPeers", description="PCI addresses of GPUs joined to this one by XGMI.")
    partition: Partition | None = Field(default=None, description="Set when this device is a compute partition.")
    split_count: int = Field(alias="splitCount", ge=1, le=64, description="How many pods may share this device.")
    healthy: bool = Field(description="False when the device cannot be opened or the exporter says so.")
    health_reason: str | None = Field(default=None, alias="healthReason", description="Why the device is unhealthy.")
    cu_topology: CuTopologyInfo | None = Field(
        default=None, alias="cuTopology",
        description="XCCs, shader engines and arrays from KFD; null from agents that do not report it (then every "
                    "CU layout is Packed on it).")


class DiscoveryProblem(_Model):
    """A sysfs entry the agent skipped while discovering GPUs, and why."""

    path: str = Field(description="The sysfs entry that could not be used.")
    reason: str = Field(description="What is wrong with it.")


class DeviceGroup(_Model):
    """A host group that owns GPU device files (video or render) and its id on this node."""

    name: str = Field(description="Group name on the node: video or render.")
    gid: int = Field(ge=0, description="Its numeric id on this node.")


class UnitTenant(_Model):
    """A pod with CUs on one XCD or shader engine."""

    pod: str = Field(min_length=1, description="The pod, namespace/name.")
    cus_held: int = Field(alias="cusHeld", ge=1, description="Its CUs on this unit (a slice that reserves no CUs: "
                                                               "every CU of the unit).")


class IsolationUnit(_Model):
    """One XCD or shader engine of a GPU and the pods on it."""

    index: int = Field(ge=0, description="The unit's index: XCD, or shader engine in XCC-then-engine order.")
    cu_count: int = Field(alias="cuCount", ge=1, description="Active CUs of the unit.")
    tenants: list[UnitTenant] = Field(default_factory=list, description="Pods with CUs on the unit.")


class GpuIsolation(_Model):
    """Which pods share each XCD (a GPU with several, each its own L2) or else each shader engine."""

    gpu_id: str = Field(alias="gpuId", min_length=1, description="The GPU's id, as in gpus.")
    unit: Literal["XCD", "SE"] = Field(description="XCD on a GPU with several XCCs, else SE (shader engine).")
    units: list[IsolationUnit] = Field(default_factory=list, description="Every unit of the GPU, in index order.")


class AmdGpuNodeStatus(_Model):
    """What the node's agent found and serves: its GPUs, their health, and the agent's conditions."""

    gpus: list[GpuInfo] = Field(default_factory=list, description="Every GPU or partition on the node.")
    gpus_total: int = Field(default=0, alias="gpusTotal", ge=0,
                            description="GPUs (or partitions) listed; derived from gpus, for `kubectl get`.")
    gpus_healthy: int = Field(default=0, alias="gpusHealthy", ge=0, description="Healthy GPUs; derived from gpus.")
    vram_total_mib: int = Field(default=0, alias="vramTotalMiB", ge=0,
                                description="Real VRAM of the listed GPUs, MiB (unknown sizes count 0); derived from gpus.")
    problems: list[DiscoveryProblem] = Field(default_factory=list, description="Entries discovery had to skip, with why.")
    operating_mode: OperatingMode = Field(default=OperatingMode.CU, alias="operatingMode", description="Mode the agent runs in.")
    device_memory_scaling: float = Field(default=1.0, alias="deviceMemoryScaling", ge=1.0, le=4.0, description="Scaling applied.")
    agent_version: str = Field(default="", alias="agentVersion", description="Version of the publishing agent.")
    last_heartbeat_time: str | None = Field(default=None, alias="lastHeartbeatTime", description="When the agent last published.")
    device_groups: list[DeviceGroup] = Field(
        default_factory=list, alias="deviceGroups",
        description="The node's video and render group ids (host group file). Non-root containers need no "
                    "supplementalGroups under rocshare (Allocate hands them device files they can open); these are "
                    "for admins who set supplementalGroups themselves.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready (GPUs found, some healthy), MemoryHook (the memory hook library is there) and DevicePlugin "
                    "(the kubelet has the device list; the extender offers the node only while it is True).")
    isolation: list[GpuIsolation] | None = Field(
        default=None,
        description="Per GPU holding pods, which pods' CUs are on each XCD or shader engine, by the kernel's mapping "
                    "of CU mask bits (docs/placement.md). Written by the operator (field manager rocshare-operator) "
                    "from the pods' allocation records, not by the agent; GPUs whose agent reports no cuTopology are "
                    "left out.")

    def device_plugin_serving(self) -> bool:
        """False while the DevicePlugin condition says the kubelet lacks the device list; an agent
        that publishes no such condition is taken at the kubelet's word (its allocatable)."""
        return next((c.status == "True" for c in self.conditions if c.type == "DevicePlugin"), True)

    @model_validator(mode="after")
    def _derive_totals(self) -> AmdGpuNodeStatus:
        # The totals are printer columns (a JSONPath cannot count); derived here, they can never
        # disagree with the list, whatever a writer or a stored object says.
        object.__setattr__(self, "gpus_total", len(self.gpus))
        object.__setattr__(self, "gpus_healthy", sum(1 for gpu in self.gpus if gpu.healthy))
        object.__setattr__(self, "vram_total_mib", sum(gpu.vram_mib or 0 for gpu in self.gpus))
        return self


class AmdGpuNodeSpec(_Model):
    """Empty: an AmdGpuNode is written by its node's agent, in status only."""


# ---- AmdGpuShare --------------------------------------------------------------------------


class ShareLimits(_Model):
    memory_mib: int | None = Field(default=None, alias="memoryMiB", ge=0, description="VRAM the namespace may hold, MiB.")
    cores_pct: int | None = Field(
        default=None, alias="coresPercent", ge=0, description="Compute, in percent of one GPU (250 = two and a half GPUs)."
    )
    gpus: int | None = Field(default=None, ge=0, description="GPU devices (amd.com/gpu) the namespace may request.")


class AmdGpuShareSpec(_Model):
    """A namespace's quota over every pool (docs/accounting.md says why a share names no pool)."""

    limits: ShareLimits = Field(description="The namespace's limits; omitted means unlimited.")


class SliceHolder(_Model):
    """One pod of the namespace that holds GPU slices, and what it holds."""

    pod: str = Field(description="Pod name.")
    node: str = Field(default="", description="Node it runs on.")
    gpu_ids: list[str] = Field(default_factory=list, alias="gpuIds", description="GPUs it holds.")
    memory_mib: int = Field(default=0, alias="memoryMiB", ge=0, description="VRAM it holds, MiB.")
    cu_count: int = Field(default=0, alias="cuCount", ge=0, description="CUs it holds.")


class ShareUsage(_Model):
    memory_mib: int = Field(default=0, alias="memoryMiB", ge=0, description="VRAM held, MiB.")
    cores_pct: int = Field(default=0, alias="coresPercent", ge=0, description="Compute held, percent of one GPU.")
    gpus: int = Field(default=0, ge=0, description="GPU devices held.")


class AmdGpuShareStatus(_Model):
    """What the namespace holds now against its limits, the pods holding it and the ResourceQuota it owns."""

    used: ShareUsage = Field(default_factory=ShareUsage, description="What the namespace holds now.")
    pods: list[SliceHolder] = Field(default_factory=list, description="Pods holding slices (at most 100 listed).")
    pods_total: int = Field(default=0, alias="podsTotal", ge=0, description="Pods holding slices, all of them.")
    quota_name: str = Field(default="", alias="quotaName", description="The ResourceQuota this share owns.")
    observed_generation: int | None = Field(default=None, alias="observedGeneration", ge=0, description="Last spec generation acted on.")
    conditions: list[Condition] = Field(default_factory=list, description="Ready.")

