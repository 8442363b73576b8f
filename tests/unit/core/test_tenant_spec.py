"""The tenant boundary at admission (rocshare.core.tenant_spec): what a GPU container's own spec may
not write. Tables: each row a container or pod a tenant with `edit` can write, and the reason it is
refused (or None). The names judged come from rocshare.api.container_env, the list the agent renders
from; tests/unit/agent/test_container_spec.py proves every variable the agent sets is in it."""

from __future__ import annotations

import pytest

from rocshare.api.container_env import prefix_can_reach_protected
from rocshare.core.tenant_spec import GpuContainer, container_path, covers_hook, pod_refusal


def refusal(container: dict, *, holds_slice: bool = True, volumes: tuple = ()) -> str | None:
    why = pod_refusal({"spec": {"volumes": list(volumes), "containers": [container]}},
                      [GpuContainer("containers[0] (c)", container, holds_slice=holds_slice)])
    return why.split(":")[0] if why else None


def env(*names: str, **value_from: dict) -> dict:
    entries = [{"name": name, "value": "x"} for name in names]
    entries += [{"name": name, "valueFrom": source} for name, source in value_from.items()]
    return {"name": "c", "env": entries}


ENV_CASES = [
    ("the issue's pod", env("HIP_DEVICE_MEMORY_LIMIT_0", "HSA_CU_MASK", "LD_AUDIT"), "ProtectedEnvVar"),
    ("memory limit of GPU 7", env("HIP_DEVICE_MEMORY_LIMIT_7"), "ProtectedEnvVar"),
    ("visible devices (ROCr)", env("ROCR_VISIBLE_DEVICES"), "ProtectedEnvVar"),
    ("visible devices (HIP)", env("HIP_VISIBLE_DEVICES"), "ProtectedEnvVar"),
    ("XNACK", env("HSA_XNACK"), "ProtectedEnvVar"),
    ("oversubscribe", env("HIP_OVERSUBSCRIBE"), "ProtectedEnvVar"),
    ("the hook's account dir", env("ROCSHARE_HOOK_DIR"), "ProtectedEnvVar"),
    ("valueFrom a ConfigMap", env(HSA_CU_MASK={"configMapKeyRef": {"name": "m", "key": "k"}}), "ProtectedEnvVar"),
    ("valueFrom a field", env(LD_AUDIT={"fieldRef": {"fieldPath": "metadata.name"}}), "ProtectedEnvVar"),
    ("the account and slice folders (issue 43)", env("ROCSHARE_ACCOUNT_DIR", "ROCSHARE_SLICE_DIR"), "ProtectedEnvVar"),
    ("ROCr's switch that skips the CU mask", env("HSA_CU_MASK_SKIP_INIT"), "ProtectedEnvVar"),
    ("the app's own variables", env("APP_MODE", "HIP_LAUNCH_BLOCKING", "LD_LIBRARY_PATH", "HSA_ENABLE_SDMA"), None),
    ("case matters (env is case-sensitive)", env("ld_audit"), None),
]


@pytest.mark.parametrize(("container", "reason"), [(c, r) for _, c, r in ENV_CASES], ids=[i for i, _, _ in ENV_CASES])
def test_env_naming_a_handed_over_variable_is_refused(container: dict, reason: str | None) -> None:
    assert refusal(container) == reason
    assert refusal(container, holds_slice=False) == reason  # whole GPUs too: the limits follow HIP order


ENV_FROM_CASES = [
    ("ConfigMap, no prefix", {"configMapRef": {"name": "m"}}, "ProtectedEnvFrom"),
    ("Secret, empty prefix", {"secretRef": {"name": "s"}, "prefix": ""}, "ProtectedEnvFrom"),
    ("prefix LD_ (LD_AUDIT)", {"configMapRef": {"name": "m"}, "prefix": "LD_"}, "ProtectedEnvFrom"),
    ("prefix H", {"configMapRef": {"name": "m"}, "prefix": "H"}, "ProtectedEnvFrom"),
    ("prefix HIP_DEVICE_", {"configMapRef": {"name": "m"}, "prefix": "HIP_DEVICE_"}, "ProtectedEnvFrom"),
    ("prefix inside a family", {"configMapRef": {"name": "m"}, "prefix": "HIP_DEVICE_MEMORY_LIMIT_0"},
     "ProtectedEnvFrom"),
    ("prefix ROCSHARE_X", {"configMapRef": {"name": "m"}, "prefix": "ROCSHARE_X"}, "ProtectedEnvFrom"),
    ("prefix HSA_CU_MASK_ (its skip switch)", {"configMapRef": {"name": "m"}, "prefix": "HSA_CU_MASK_"},
     "ProtectedEnvFrom"),
    ("prefix APP_", {"configMapRef": {"name": "m"}, "prefix": "APP_"}, None),
    ("prefix HIPX_", {"secretRef": {"name": "s"}, "prefix": "HIPX_"}, None),
]


@pytest.mark.parametrize(("source", "reason"), [(s, r) for _, s, r in ENV_FROM_CASES],
                         ids=[i for i, _, _ in ENV_FROM_CASES])
def test_env_from_that_could_set_a_handed_over_variable_is_refused(source: dict, reason: str | None) -> None:
    assert refusal({"name": "c", "envFrom": [source]}) == reason


def test_the_env_from_message_says_how_to_fix_it() -> None:
    container = {"name": "c", "envFrom": [{"configMapRef": {"name": "tuning"}}]}
    why = pod_refusal({"spec": {}}, [GpuContainer("containers[0] (c)", container, holds_slice=True)])
    assert why is not None and "configMapRef tuning without a prefix" in why and "APP_" in why and "env" in why


MOUNT_CASES = [
    ("the hook's directory", "/usr/local/vgpu", "HookPathMount"),
    ("the library itself (subPath)", "/usr/local/vgpu/libamvgpu.so", "HookPathMount"),
    ("trailing slash", "/usr/local/vgpu/", "HookPathMount"),
    ("dot-dot", "/usr/local/x/../vgpu", "HookPathMount"),
    ("double slash", "//usr//local/vgpu", "HookPathMount"),
    ("relative (the kubelet puts it under /)", "usr/local/vgpu", "HookPathMount"),
    ("above it: /usr/local", "/usr/local", "HookPathMount"),
    ("above it: /usr", "/usr", "HookPathMount"),
    ("a forged slice folder (issue 43)", "/usr/local/vgpu/slice", "HookPathMount"),
    ("a forged limits file (issue 43)", "/usr/local/vgpu/slice/limits", "HookPathMount"),
    ("the account folder (issue 43)", "/usr/local/vgpu/account", "HookPathMount"),
    ("a sibling", "/usr/local/vgpu2", None),
    ("elsewhere", "/data", None),
    ("/tmp", "/tmp", None),
]


@pytest.mark.parametrize(("target", "reason"), [(t, r) for _, t, r in MOUNT_CASES], ids=[i for i, _, _ in MOUNT_CASES])
def test_mounts_over_the_hook_are_refused(target: str, reason: str | None) -> None:
    mount = {"name": "v", "mountPath": target, "subPath": "libfake.so"}
    assert refusal({"name": "c", "volumeMounts": [mount]}) == reason
    assert refusal({"name": "c", "volumeDevices": [{"name": "v", "devicePath": target}]}) == reason


def test_container_path_is_the_kubelets() -> None:
    assert container_path("a/b/../c") == "/a/c" and container_path("///") == "/" and covers_hook("/")


HOST_PATH_CASES = [
    ("/", "HostDeviceVolume"), ("/dev", "HostDeviceVolume"), ("/dev/dri", "HostDeviceVolume"),
    ("/dev/kfd", "HostDeviceVolume"), ("/sys", "HostDeviceVolume"), ("/sys/class/drm", "HostDeviceVolume"),
    ("/proc", "HostDeviceVolume"), ("/dev/../dev/dri/", "HostDeviceVolume"), ("//dev", "HostDeviceVolume"),
    ("/devices", None), ("/data/models", None), ("/var/log", None),
]


@pytest.mark.parametrize(("host_path", "reason"), HOST_PATH_CASES, ids=[p for p, _ in HOST_PATH_CASES])
def test_host_device_volumes_are_refused_beside_a_slice(host_path: str, reason: str | None) -> None:
    volumes = ({"name": "host", "hostPath": {"path": host_path}},)
    assert refusal({"name": "c"}, volumes=volumes) == reason
    assert refusal({"name": "c"}, holds_slice=False, volumes=volumes) is None  # whole GPUs: as before


def test_privileged_is_refused_for_a_slice_only() -> None:
    container = {"name": "c", "securityContext": {"privileged": True}}
    assert refusal(container) == "PrivilegedSlice"
    assert refusal(container, holds_slice=False) is None


def test_a_plain_prefix_hands_nothing_over() -> None:
    assert (not prefix_can_reach_protected("APP_") and prefix_can_reach_protected("")
            and prefix_can_reach_protected("ROCSHARE"))


def test_a_pod_without_gpu_containers_is_not_judged() -> None:
    pod = {"spec": {"volumes": [{"name": "h", "hostPath": {"path": "/dev"}}],
                    "containers": [{"name": "c", "env": [{"name": "LD_AUDIT", "value": "x"}]}]}}
    assert pod_refusal(pod, []) is None
