"""agent_daemonset: the rendered node-agent DaemonSet of a pool."""

from __future__ import annotations

from rocshare_operator.reconcilers.agent_daemonset import AgentDeployment, daemonset_name, render_daemonset


def render(**agent) -> dict:
    pool = {"metadata": {"name": "mi300", "uid": "u-1"}, "spec": {"nodeSelector": {"gpu": "amd"}, "agent": agent}}
    return render_daemonset(pool, AgentDeployment(namespace="gpu-system"))


def test_defaults() -> None:
    daemonset = render()
    pod = daemonset["spec"]["template"]["spec"]
    assert daemonset["metadata"]["namespace"] == "gpu-system"
    assert daemonset["metadata"]["ownerReferences"][0] == {
        "apiVersion": "rocshare.io/v1alpha1", "kind": "AmdGpuPool", "name": "mi300", "uid": "u-1",
        "controller": True, "blockOwnerDeletion": True}
    assert pod["nodeSelector"] == {"rocshare.io/pool": "mi300"}
    assert pod["serviceAccountName"] == "rocshare-node-agent"
    assert "priorityClassName" not in pod
    assert daemonset["spec"]["selector"]["matchLabels"] == daemonset["spec"]["selector"]["matchLabels"] | {
        "app.kubernetes.io/instance": "mi300"}
    container = pod["containers"][0]
    assert container["image"] == "rocshare/node-agent:0.1.0"
    assert "--sysfs-root=/sys" in container["args"]
    assert container["resources"]["requests"] == {"cpu": "50m", "memory": "64Mi"}


def test_pool_agent_settings_flow_in_and_odd_values_stay_strings() -> None:
    daemonset = render(image="reg/agent:1", sysfsRoot="/host sys: x", priorityClassName="gpu-critical",
                       tolerations=[{"key": "dedicated", "operator": "Equal", "value": "gpu"}])
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "gpu-critical"
    assert {"key": "dedicated", "operator": "Equal", "value": "gpu"} in pod["tolerations"]
    assert "--sysfs-root=/host sys: x" in pod["containers"][0]["args"]
    assert pod["volumes"][0]["hostPath"]["path"] == "/host sys: x"


def test_long_pool_names_give_short_unique_daemonset_names() -> None:
    one, two = daemonset_name("p" * 60), daemonset_name("p" * 59 + "q")
    assert len(one) <= 63 and len(two) <= 63 and one != two
    assert daemonset_name("mi300") == "rocshare-node-agent-mi300"


def test_the_pools_interface_picks_the_agents_kubelet_side() -> None:
    plugin = render()["spec"]["template"]["spec"]
    assert "--interface=DevicePlugin" in plugin["containers"][0]["args"]
    assert {"dra-plugins", "dra-registry"}.isdisjoint(v["name"] for v in plugin["volumes"])
    plugin_mounts = {m["name"]: m["mountPath"] for m in plugin["containers"][0]["volumeMounts"]}
    # Both modes write CDI specs: the load check's (device plugin), prepared claims (DRA).
    plugin_host = {v["name"]: v["hostPath"]["path"] for v in plugin["volumes"]}
    assert plugin_mounts["cdi"] == plugin_host["cdi"] == "/var/run/cdi"
    from rocshare_agent.load_check import DEFAULT_LOAD_CHECK_DIR  # the agent's default --load-check-dir
    assert plugin_mounts["load-check"] == plugin_host["load-check"] == DEFAULT_LOAD_CHECK_DIR
    from rocshare.api.container_account import DEFAULT_ACCOUNT_ROOT  # the account folders the agent binds
    assert plugin_mounts["accounts"] == plugin_host["accounts"] == DEFAULT_ACCOUNT_ROOT
    assert f"--account-dir={DEFAULT_ACCOUNT_ROOT}" in plugin["containers"][0]["args"]
    dra = render(interface="DRA")["spec"]["template"]["spec"]
    assert "--interface=DRA" in dra["containers"][0]["args"]
    mounts = {m["name"]: m["mountPath"] for m in dra["containers"][0]["volumeMounts"]}
    host = {v["name"]: v["hostPath"]["path"] for v in dra["volumes"]}
    for name, path in {"dra-plugins": "/var/lib/kubelet/plugins", "dra-registry": "/var/lib/kubelet/plugins_registry",
                       "cdi": "/var/run/cdi"}.items():
        assert mounts[name] == host[name] == path  # the agent's default flags name these very paths
