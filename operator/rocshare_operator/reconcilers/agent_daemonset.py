"""The node-agent DaemonSet of a pool, rendered from templates/agent-daemonset.yaml.j2.

Pure apart from reading the packaged template: takes the pool object and operator
settings, returns the DaemonSet dict the operator server-side applies (field
manager ``rocshare-operator``). The pool owns it, so deleting the pool removes it
(a cluster-scoped owner of a namespaced object is allowed). Its pods run only on
the pool's nodes (``rocshare.io/pool=<pool>``) and tolerate the usual GPU taint.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from functools import cache, lru_cache

import jinja2
import yaml

from rocshare.api.models import API_VERSION, AmdGpuPoolSpec
from rocshare.api.node_settings import POOL_LABEL
from rocshare_operator.context import AGENT_NAME, AgentDeployment

NAME_MAX_CHARS = 63  # DaemonSet names end up in pod names and labels
METRICS_PORT = 9394
GPU_TOLERATION = {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def daemonset_name(pool: str) -> str:
    name = f"{AGENT_NAME}-{pool}"
    if len(name) <= NAME_MAX_CHARS:
        return name
    digest = hashlib.sha256(pool.encode()).hexdigest()[:8]
    return f"{name[:NAME_MAX_CHARS - 9].rstrip('-.')}-{digest}"


def render_daemonset(pool: Mapping, deployment: AgentDeployment) -> dict:
    """The DaemonSet for `pool` (an AmdGpuPool object with metadata.name and uid)."""
    meta = pool["metadata"]
    spec = AmdGpuPoolSpec.model_validate(dict(pool.get("spec") or {}))
    agent = spec.agent.to_json_dict()
    selector_labels = {"app.kubernetes.io/name": AGENT_NAME, "app.kubernetes.io/instance": meta["name"]}
    text = _template().render(
        name=daemonset_name(meta["name"]), namespace=deployment.namespace, pool=meta["name"], pool_label=POOL_LABEL,
        labels={**selector_labels, "app.kubernetes.io/managed-by": "rocshare-operator", POOL_LABEL: meta["name"]},
        selector_labels=selector_labels, service_account=deployment.service_account, agent=agent,
        tolerations=[GPU_TOLERATION, *agent.get("tolerations", [])], resources=dict(deployment.resources),
        metrics_port=METRICS_PORT,
        owner={"apiVersion": API_VERSION, "kind": "AmdGpuPool", "name": meta["name"], "uid": meta["uid"]},
    )
    return copy.deepcopy(_parsed(text))


@lru_cache(maxsize=64)
def _parsed(text: str) -> dict:
    """Parsing YAML costs ~1 ms; a pool's loop renders the same text on every pass."""
    return yaml.safe_load(text)


@cache
def _template() -> jinja2.Template:
    environment = jinja2.Environment(loader=jinja2.PackageLoader("rocshare_operator.reconcilers", "templates"),
                                     undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)
    return environment.get_template("agent-daemonset.yaml.j2")
