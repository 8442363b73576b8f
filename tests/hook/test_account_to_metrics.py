"""Issue 43, the whole path on one machine without a GPU: the device plugin's Allocate (the real
service, with the node's account store) hands a slice container its account folder; a hook-probe
standing in for that container (dev/rocshare_dev/devcluster/hook_workloads.py, what `make demo`
runs) holds half its slice under the real hook and stub runtime; the node agent's monitor then
reports the container under HAMi's names from the account -- where KFD shows no process at all.
The expected figures are worked out here from the record."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from prometheus_client import CollectorRegistry

from rocshare_agent.accounts import AccountStore
from rocshare_agent.deviceplugin.service import DevicePluginService
from rocshare_agent.discovery import discover
from rocshare_agent.monitor import GpuMetricsCollector
from rocshare_dev.devcluster.hook_workloads import probe_env
from tests.agent_fakes import MemoryPods, hook_present
from tests.hook.conftest import MIB, HookBuild
from tests.unit.agent.test_deviceplugin_service import NODE, committed_pod, request

SYSFS = (Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures" / "sysfs").resolve()


async def test_a_probe_in_an_allocated_slice_shows_in_the_monitor(hook_build: HookBuild, tmp_path):
    sysfs = SYSFS / "vega10-1gpu"  # read only; no KFD process in it
    [vega] = discover(sysfs).gpus
    pod = committed_pod("p", {"main": [vega.id]})  # a 2048 MiB slice, CUs 0-51
    store = AccountStore(tmp_path / "accounts")
    service = DevicePluginService(node_name=NODE, pods=MemoryPods([pod]), hook_host_dir="/opt/vgpu",
                                  hook_check=hook_present, accounts=store)
    service.set_inventory([vega.model_copy(update={"render_minor": 128})])
    response = (await service.allocate(request(1))).container_responses[0]
    spec = {"envs": dict(response.envs), "mounts": [
        {"hostPath": m.host_path, "containerPath": m.container_path, "readOnly": m.read_only} for m in response.mounts]}
    env = probe_env(spec, hook_library=hook_build.library, base_env=os.environ)
    env["LD_LIBRARY_PATH"] = str(hook_build.stub_dir)
    held_bytes = 2048 * MIB // 2
    probe = subprocess.Popen([str(hook_build.probe), "hold", str(held_bytes)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert json.loads(probe.stdout.readline())["result"] == "hipSuccess"
        registry = CollectorRegistry()
        registry.register(GpuMetricsCollector(sysfs_root=sysfs, proc_root=tmp_path / "proc", node_name=NODE,
                                              pods=lambda: [pod], accounts=store))
        labels = {"namespace": "ns", "pod": "p", "container": "main", "vdevice_index": "0", "device_uuid": vega.id}
        hami = {**labels, "zone": "vGPU"}
        assert registry.get_sample_value("hami_vgpu_memory_used_bytes", hami) == held_bytes
        assert registry.get_sample_value("hami_vgpu_memory_limit_bytes", hami) == 2048 * MIB
        assert registry.get_sample_value("rocshare_container_memory_peak_bytes", labels) == held_bytes
        assert registry.get_sample_value("rocshare_container_processes",
                                         {"namespace": "ns", "pod": "p", "container": "main"}) == 1
    finally:
        probe.kill()
        probe.wait(timeout=10)
