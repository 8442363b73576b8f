"""The operator owns its webhook certificate (the dev overlay's `--webhook-tls-secret`):

* at start, before anything serves: read the Secret; when it is missing or due for renewal
  (`certificate.renewal_reason`), make a new CA and serving certificate and store them (create,
  or update guarded by the resourceVersion, so two replicas never both win); write the CA
  into `caBundle` of the webhook configurations; write the key pair to a private folder, where
  Kopf's webhook server loads it into our SSL context;
* then every `check_interval_s`: the same, reloading the served pair when the Secret changed
  (renewed here or by another replica). New TLS connections get the new certificate.

Needs (overlays/dev/webhook-tls-rbac.yaml): create secrets; get, update this Secret; get,
patch the two `rocshare-pods` webhook configurations.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from rocshare.kube.client import ApiError, Conflict, Kube, NotFound, object_path
from rocshare_operator.admission.certificate import TlsBundle, issue, renewal_reason

log = logging.getLogger(__name__)
WEBHOOK_CONFIGURATIONS = ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")


@dataclass(frozen=True)
class TlsSecretSettings:
    namespace: str
    secret: str
    service: str = "rocshare-webhook"
    webhook_configuration: str = "rocshare-pods"
    folder: Path = Path("/tmp/rocshare-webhook-tls")
    check_interval_s: float = 3600.0

    @property
    def cert_path(self) -> Path:
        return self.folder / "tls.crt"

    @property
    def key_path(self) -> Path:
        return self.folder / "tls.key"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


async def ensure_secret(kube: Kube, settings: TlsSecretSettings) -> TlsBundle:
    """The bundle to serve: the Secret's, or a new one stored there when it had to be renewed."""
    path = object_path("v1", "secrets", settings.secret, namespace=settings.namespace)
    for _attempt in range(5):
        try:
            secret = await kube.get(path)
        except NotFound:
            secret = None
        current = TlsBundle.from_secret_data(secret.get("data") if secret else None)
        reason = renewal_reason(current, settings.service, settings.namespace, now=_now())
        if reason is None:
            return current
        log.info("webhook certificate in Secret %s/%s: %s; issuing a new one", settings.namespace,
                 settings.secret, reason)
        fresh = issue(settings.service, settings.namespace, now=_now(), previous=current)
        body = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                "metadata": {"name": settings.secret, "namespace": settings.namespace,
                             "labels": {"app.kubernetes.io/part-of": "rocshare",
                                        "app.kubernetes.io/managed-by": "rocshare-operator"}},
                "data": fresh.secret_data()}
        try:
            if secret is None:
                await kube.create(object_path("v1", "secrets", namespace=settings.namespace), body)
            else:
                body["metadata"]["resourceVersion"] = secret["metadata"]["resourceVersion"]
                await kube.request("PUT", path, body=body)
            return fresh
        except Conflict:
            continue  # another replica wrote it first: read theirs
    raise RuntimeError(f"Secret {settings.namespace}/{settings.secret} kept changing under us")


async def publish_ca_bundle(kube: Kube, settings: TlsSecretSettings, bundle: TlsBundle) -> None:
    """Set `caBundle` of every webhook in both configurations to the bundle's CA certificates. A
    configuration that does not exist is skipped: with the pod-defaults admission policy
    (manifests/components/pod-defaults-policy) no webhook is installed."""
    wanted = base64.b64encode(bundle.ca_pem).decode()
    for plural in WEBHOOK_CONFIGURATIONS:
        path = object_path("admissionregistration.k8s.io/v1", plural, settings.webhook_configuration)
        try:
            configuration = await kube.get(path)
        except NotFound:
            continue
        operations = [{"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": wanted}
                      for index, webhook in enumerate(configuration.get("webhooks") or [])
                      if webhook.get("clientConfig", {}).get("caBundle") != wanted]
        if operations:
            await kube.json_patch(path, operations)
            log.info("caBundle of %s %s updated", plural, settings.webhook_configuration)


def write_pair(settings: TlsSecretSettings, bundle: TlsBundle) -> bool:
    """Write the pair for the server; True when it changed."""
    settings.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if settings.cert_path.exists() and settings.cert_path.read_bytes() == bundle.cert_pem \
            and settings.key_path.read_bytes() == bundle.key_pem:
        return False
    for path, content in ((settings.key_path, bundle.key_pem), (settings.cert_path, bundle.cert_pem)):
        temporary = path.with_suffix(".new")
        temporary.write_bytes(content)
        os.chmod(temporary, 0o600)
        temporary.replace(path)
    return True


async def bootstrap(kubeconfig: str | None, settings: TlsSecretSettings) -> None:
    """Before the operator serves: a valid pair on disk. The caBundle is published too, but its
    configurations may not exist yet (same apply): `keep_fresh` retries that."""
    async with await Kube.connect(kubeconfig) as kube:
        bundle = await ensure_secret(kube, settings)
        write_pair(settings, bundle)
        try:
            await publish_ca_bundle(kube, settings, bundle)
        except ApiError as error:
            log.warning("caBundle not published yet (%s); retrying in the background", error)


async def keep_fresh(kube: Kube, settings: TlsSecretSettings, context: ssl.SSLContext) -> None:
    """Forever: renew when due, follow the Secret, keep the caBundle, reload the served pair."""
    published = False
    while True:
        await asyncio.sleep(settings.check_interval_s if published else 10.0)
        try:
            bundle = await ensure_secret(kube, settings)
            if write_pair(settings, bundle):
                context.load_cert_chain(settings.cert_path, settings.key_path)
                log.info("webhook now serves the certificate from Secret %s/%s", settings.namespace, settings.secret)
            await publish_ca_bundle(kube, settings, bundle)
            published = True
        except (ApiError, RuntimeError, OSError, ssl.SSLError) as error:
            log.warning("webhook certificate upkeep failed (%s); retrying", error)
            published = False
