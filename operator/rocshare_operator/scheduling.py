"""Wires the scheduling half of the operator process: the scheduler extender (with its
caches) and the pod admission webhook, both reading one `SchedulerState`.

`run_operator(..., extra_tasks=[extender_task(settings, state)])` runs the extender beside
Kopf (and `admission_params_task` keeps the pod-defaults admission policy's parameters written);
`register_webhook(settings, state)` adds the admission handlers to Kopf's registry
and `configure_admission(kopf_settings, webhook_settings)` points Kopf's webhook server
at our TLS certificate. With `--webhook-tls-secret` the operator owns that certificate
(admission/tls_secret.py): made or renewed before anything serves, kept fresh beside Kopf.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable

import kopf

from rocshare.core.inventory import GpuSpec, node_inventory
from rocshare_operator.admission import claim_quota, dra_pods, policy_params, tls_secret, webhook
from rocshare_operator.admission.pods import runtime_class_for
from rocshare_operator.context import OperatorContext
from rocshare_operator.extender.server import ExtenderSettings, run_extender, subscribe
from rocshare_operator.extender.state import SchedulerState
from rocshare_operator.leadership import DecisionGate, LeaseFollower, this_process_identity
from rocshare_operator.reconcilers import nodes_status


def extender_task(settings: ExtenderSettings, state: SchedulerState, gate: DecisionGate | None = None):
    def serve(context: OperatorContext) -> Awaitable[None]:
        # Now, not inside the coroutine: run_operator calls this before the cluster feed runs.
        subscribe(context.feed, state)
        nodes_status.use_accounts(context, state.accounts)  # one hold index: status derives from the extender's
        if gate is not None:
            context.gate = gate
        return run_extender(context.kube, settings, state, feed=context.feed, gate=gate)

    return serve


def leadership_task(args, gate: DecisionGate, kopf_settings: kopf.OperatorSettings):
    """Follows kube-scheduler's Lease (--scheduler-lease): the gate, and Kopf's peering priority
    unless Kopf runs standalone."""
    def follow(context: OperatorContext) -> Awaitable[None]:
        peering = None if args.standalone else kopf_settings.peering
        follower = LeaseFollower(context.kube, gate, namespace=args.namespace, lease=args.scheduler_lease,
                                 scheduler_host=args.scheduler_host or socket.gethostname(), peering=peering,
                                 identity=this_process_identity())
        return follower.run()

    return follow


def register_webhook(settings: webhook.WebhookSettings, state: SchedulerState) -> None:
    quota = claim_quota.ClaimQuota(limits=state.quota_limits, shapes=lambda: claim_quota.dra_shapes(
        state.pools, state.index.node_pools, lambda node: gpus_of(state, node)))
    webhook.register(kopf.get_default_registry(), settings, lambda pod: runtime_class_for(pod, state.pools),
                     lambda pod: dra_plan(pod, state), quota)


def dra_plan(pod: dict, state: SchedulerState) -> dra_pods.DraPlan | None:
    """The pod's claims when it goes to DRA pools (admission/dra_pods.py), the GPU shapes read from
    the AmdGpuNodes of those pools' nodes; None when it goes to the device plugin path."""
    pools = dra_pods.dra_pools_for(pod, state.pools)
    if not pools:
        return None
    return dra_pods.plan_dra(pod, pools, dra_pods.pool_shapes(pools, state.index.node_pools,
                                                               lambda node: gpus_of(state, node)))


def gpus_of(state: SchedulerState, node: str) -> tuple[GpuSpec, ...]:
    """The node's GPUs as its agent publishes them (inventory.node_inventory: its AmdGpuNode and the
    sharing marked on the Node); () when unknown or the node is in no known pool."""
    index = state.index
    status, pool, facts = index.gpu_status.get(node), state.pools.get(index.node_pools.get(node, "")), \
        index.nodes.get(node)
    if status is None or pool is None or facts is None:
        return ()
    inventory = node_inventory(node, status.gpus, facts.view.marks.sharing())
    return () if isinstance(inventory, str) else inventory.gpus


def configure_admission(kopf_settings: kopf.OperatorSettings, settings: webhook.WebhookSettings) -> None:
    kopf_settings.admission.server = webhook.server(settings)
    kopf_settings.admission.managed = None  # configurations come from manifests/ (see webhook.py)


def prepare(args, kopf_settings: kopf.OperatorSettings) -> list:
    """Register the webhook and return the extra tasks for run_operator, from parsed flags."""
    state = SchedulerState()
    tasks = []
    if not args.no_webhook:
        settings = webhook.WebhookSettings(host=args.webhook_host, port=args.webhook_port, certfile=args.webhook_cert,
                                           pkeyfile=args.webhook_key, scheduler_name=args.scheduler_name,
                                           client_ca=webhook.readable_client_ca(args.webhook_client_ca))
        settings.trusted_users = settings.trusted_users | frozenset(args.trusted_user)
        if args.webhook_tls_secret:
            tasks.append(own_certificate(args, settings))
        register_webhook(settings, state)
        configure_admission(kopf_settings, settings)
    if args.no_extender:
        return tasks
    extender = ExtenderSettings(host=args.extender_host, port=args.extender_port, metrics_port=args.metrics_port,
                                tls_cert=args.extender_tls_cert, tls_key=args.extender_tls_key,
                                bind_wait_s=args.bind_wait_s)
    gate = DecisionGate()
    tasks.append(extender_task(extender, state, gate))
    if args.scheduler_lease:
        tasks.append(leadership_task(args, gate, kopf_settings))
    if not args.no_webhook:
        tasks.append(admission_params_task(args.namespace, state, scheduler_name=args.scheduler_name))
    return tasks


def admission_params_task(namespace: str, state: SchedulerState, *, scheduler_name: str):
    """Keeps the pod-defaults policy's parameters written (admission/policy_params.py), from the
    pools the extender's state knows."""
    def publish(context: OperatorContext) -> Awaitable[None]:
        return policy_params.keep_published(
            context.kube, namespace, lambda: policy_params.admission_params(state.pools, scheduler_name=scheduler_name))

    return publish


def own_certificate(args, settings: webhook.WebhookSettings):
    """Make or renew the Secret's pair now (before Kopf serves), point the webhook server at it
    through an SSL context we keep, and return the task that keeps it fresh."""
    tls = tls_secret.TlsSecretSettings(namespace=args.namespace, secret=args.webhook_tls_secret)
    asyncio.run(tls_secret.bootstrap(args.kubeconfig, tls))
    context = ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)
    settings.certfile, settings.pkeyfile, settings.ssl_context = str(tls.cert_path), str(tls.key_path), context

    def keep_fresh(operator: OperatorContext) -> Awaitable[None]:
        return tls_secret.keep_fresh(operator.kube, tls, context)

    return keep_fresh
