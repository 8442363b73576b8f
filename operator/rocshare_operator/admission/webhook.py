"""The pod admission webhook, served by Kopf's admission server (TLS) in the operator.

Kopf serves the handlers; the webhook configurations are not managed by Kopf but
shipped in manifests/ (and created by the e2e tests), because they need what Kopf's
generated ones lack: a namespaceSelector that keeps kube-system and rocshare-system
out (so a dead operator can never block the control plane) with failurePolicy Fail
everywhere else (so a GPU pod is never admitted unchecked).

Handler ids are the URL paths: /pods.mutate.rocshare.io and /pods.validate.rocshare.io, and
/resourceclaims.validate.rocshare.io (claim_quota.py: AmdGpuShare quota for DRA claims).
The mutating handler also refuses bad GPU pods (checking the pod as mutated; in a DRA pool, the
pod as asked, before its amd.com/* limits become a claim), so creating a GPU pod costs one webhook
call. A pod naming DRA claims is checked too when it carries what core/tenant_spec.py judges: the
handler reads each claim's class (rocshare_claims_of). The validating handler is called only for
writes that carry or change an allocation annotation and come from someone other than rocshare's
own service accounts (matchConditions); it refuses them unless the user is one of `trusted_users`.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TypeVar

import kopf

from rocshare.api.dra import DRA_SCHEDULER_NAME
from rocshare.api.dra_request import DRA_REQUEST_ANNOTATION, encode_request
from rocshare.kube.client import ApiError, Conflict, Kube
from rocshare_operator.admission.claim_quota import CLAIM_VALIDATE_ID, ClaimQuota
from rocshare_operator.admission.dra_pods import DraPlan
from rocshare_operator.admission.pods import (
    Refused,
    apply_mutation,
    asks_for_gpus,
    claim_asks_rocshare,
    plan_mutation,
    validate_create,
    validate_update,
)

DraPlanner = Callable[[dict], "DraPlan | None"]
"""The pod (defaulted) -> its claims when it goes to DRA pools, None when it does not; raises Refused."""

T = TypeVar("T")
MUTATE_ID = "pods.mutate.rocshare.io"
VALIDATE_ID = "pods.validate.rocshare.io"


@dataclass
class WebhookSettings:
    host: str = "0.0.0.0"
    port: int = 9443
    certfile: str | None = None
    pkeyfile: str | None = None
    # Kopf loads certfile/pkeyfile into this context; keeping it lets a renewal reload the pair.
    ssl_context: ssl.SSLContext | None = None
    # A PEM CA file: callers must present a client certificate it signed (None: any caller).
    client_ca: str | None = None
    scheduler_name: str = "rocshare-scheduler"
    dra_scheduler_name: str = DRA_SCHEDULER_NAME
    trusted_users: frozenset[str] = field(default_factory=lambda: frozenset({
        "system:serviceaccount:rocshare-system:rocshare-operator",
        "system:serviceaccount:rocshare-system:rocshare-node-agent",
    }))


def register(registry: kopf.OperatorRegistry, settings: WebhookSettings,
             runtime_class_for: Callable[[dict], str | None], dra_plan_for: DraPlanner = lambda _pod: None,
             claim_quota: ClaimQuota | None = None) -> None:
    """Add the two pod handlers to `registry`, and with `claim_quota` the ResourceClaim quota check."""

    # Handlers are coroutines (only a DRA pod's templates are awaited): Kopf runs plain functions
    # in a thread pool, and the hop costs more than the check.
    def trusted(userinfo: dict) -> bool:
        return userinfo.get("username", "") in settings.trusted_users

    @kopf.on.mutate("v1", "pods", id=MUTATE_ID, operations=["CREATE"], registry=registry, side_effects=True)
    async def mutate(body: kopf.Body, patch: kopf.Patch, userinfo: dict, dryrun: bool, memo: kopf.Memo,
                     **_: object) -> None:
        """Default the GPU pod, then check it as it will be stored: one call per pod created. A pod
        going to DRA pools gets its claims instead, and DRA mode's scheduler profile (its allocator picks
        the devices, the extender scores the nodes)."""
        pod = dict(body)
        plan = plan_mutation(pod, scheduler_name=settings.scheduler_name, runtime_class_name=runtime_class_for(pod))
        claims = await rocshare_claims_of(memo.rocshare.kube, body.metadata.namespace, pod)
        if asks_for_gpus(pod):
            defaulted = apply_mutation(pod, replace(plan, scheduler_name=None, runtime_class_name=None))
            dra = _refuse_unless(lambda: dra_plan_for(defaulted))
            if dra is not None:
                # Every check of the device-plugin path, on the pod as asked: once its amd.com/*
                # limits are a claim, nothing in it would say it holds a slice.
                _refuse_unless(lambda: validate_create(defaulted, trusted=trusted(userinfo), rocshare_claims=claims))
                await write_device_classes(memo.rocshare.kube, dra.device_classes, dryrun=dryrun)
                await write_templates(memo.rocshare.kube, body.metadata.namespace, dra.templates, dryrun=dryrun)
                _patch_dra(patch, pod, dra, plan.runtime_class_name, settings.dra_scheduler_name)
                return
        mutated = pod if plan.empty else apply_mutation(pod, plan)
        _refuse_unless(lambda: validate_create(mutated, trusted=trusted(userinfo), rocshare_claims=claims))
        for key in ("schedulerName", "runtimeClassName", "containers", "initContainers"):
            if key in mutated["spec"] and mutated["spec"][key] != pod.get("spec", {}).get(key):
                patch.spec[key] = mutated["spec"][key]

    @kopf.on.validate("v1", "pods", id=VALIDATE_ID, operations=["CREATE", "UPDATE"], registry=registry)
    async def validate(body: kopf.Body, old: kopf.Body | None, operation: str | None, userinfo: dict,
                 **_: object) -> None:
        if operation == "UPDATE" and old is not None:
            _refuse_unless(lambda: validate_update(dict(old), dict(body), trusted=trusted(userinfo)))
        else:
            _refuse_unless(lambda: validate_create(dict(body), trusted=trusted(userinfo)))


    if claim_quota is None:
        return

    @kopf.on.validate("resource.k8s.io", "v1", "resourceclaims", id=CLAIM_VALIDATE_ID, operations=["CREATE"],
                      registry=registry)
    async def validate_claim(body: kopf.Body, dryrun: bool, memo: kopf.Memo, **_: object) -> None:
        """A claim of rocshare's DRA class must fit its namespace's AmdGpuShare limits (claim_quota.py)."""
        ctx = memo.rocshare
        why = claim_quota.refusal(dict(body), ctx.accounts, ctx.feed.claims_in, dry_run=dryrun)
        if why is not None:
            raise kopf.AdmissionError(why, code=403)


async def rocshare_claims_of(kube: Kube, namespace: str, pod: dict) -> frozenset[str]:
    """The pod's claims (spec.resourceClaims names) that are, or may be, of rocshare's DRA class:
    those whose ResourceClaim or ResourceClaimTemplate asks it, and those that cannot be read (not
    written yet, or the read failed): a claim created after the pod must not escape the checks."""
    found = set()
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        for field_name, resource, depth in _CLAIM_SOURCES:
            if not entry.get(field_name):
                continue
            try:
                body = await kube.get(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/{resource}/{entry[field_name]}")
            except ApiError:
                found.add(entry.get("name"))
                continue
            for _ in range(depth):
                body = body.get("spec") or {}
            if claim_asks_rocshare(body):
                found.add(entry.get("name"))
    return frozenset(found)


_CLAIM_SOURCES = (("resourceClaimName", "resourceclaims", 1),
                  ("resourceClaimTemplateName", "resourceclaimtemplates", 2))
"""A pod claim's source: (its field, the resource it names, how deep the claim spec is in that object)."""


async def write_templates(kube: Kube, namespace: str, templates: tuple[dict, ...], *, dryrun: bool) -> None:
    """Create each template unless it exists (named by its content: an existing one is the same)."""
    if dryrun:
        return
    for template in templates:
        try:
            await kube.create(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates", template)
        except Conflict:
            pass
        except ApiError as error:  # the pod would name a template that is not there: refuse it, saying why
            raise kopf.AdmissionError(f"cannot write ResourceClaimTemplate {namespace}/{template['metadata']['name']} "
                                      f"for the pod's amd.com/* request (DRA pool): {error}", code=500) from None


async def write_device_classes(kube: Kube, classes: tuple[dict, ...], *, dryrun: bool) -> None:
    """Create each DeviceClass of a GPU shape unless it exists (named by its shape: an existing one is the same)."""
    if dryrun:
        return
    for device_class in classes:
        try:
            await kube.create("/apis/resource.k8s.io/v1/deviceclasses", device_class)
        except Conflict:
            pass
        except ApiError as error:  # the claim would name a class that is not there: refuse the pod, saying why
            raise kopf.AdmissionError(f"cannot write DeviceClass {device_class['metadata']['name']} for the pod's "
                                      f"amd.com/* request (DRA pool): {error}", code=500) from None


def _patch_dra(patch: kopf.Patch, pod: dict, dra: DraPlan, runtime_class_name: str | None,
               scheduler_name: str) -> None:
    for key in ("containers", "initContainers", "resourceClaims"):
        if key in dra.spec and dra.spec[key] != pod.get("spec", {}).get(key):
            patch.spec[key] = dra.spec[key]
    if pod.get("spec", {}).get("schedulerName") != scheduler_name:  # DRA mode's profile, as the device plugin's
        patch.spec["schedulerName"] = scheduler_name
    if runtime_class_name:
        patch.spec["runtimeClassName"] = runtime_class_name
    if dra.request is not None:  # what the extender's score for DRA pods reads (always ours: a forged one is replaced)
        patch.metadata.annotations[DRA_REQUEST_ANNOTATION] = encode_request(dra.request)


def _refuse_unless(check: Callable[[], T]) -> T:
    try:
        return check()
    except Refused as refused:
        raise kopf.AdmissionError(str(refused), code=422) from None


def server(settings: WebhookSettings) -> kopf.WebhookServer:
    """Kopf's TLS server; with `client_ca`, a caller without a client certificate signed by it is
    refused at the handshake (CERT_REQUIRED), before any review reaches a handler."""
    verify = {} if settings.client_ca is None else {"verify_mode": ssl.CERT_REQUIRED,
                                                    "verify_cafile": settings.client_ca}
    return kopf.WebhookServer(addr=settings.host, port=settings.port, certfile=settings.certfile,
                              pkeyfile=settings.pkeyfile, context=settings.ssl_context, **verify)


def readable_client_ca(path: str | None) -> str | None:
    """`path` when it holds at least one CA certificate Python's ssl can load; None stays None.
    Raises SystemExit naming the file otherwise, so a bad install fails at start, not at the first call."""
    if path is None:
        return None
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_verify_locations(cafile=path)
    except (OSError, ssl.SSLError) as error:
        raise SystemExit(f"--webhook-client-ca {path}: cannot load a CA certificate from it: {error}") from None
    return path
