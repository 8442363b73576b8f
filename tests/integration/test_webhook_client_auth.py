"""The admission webhook authenticates its caller when `--webhook-client-ca` is set: the operator's
own server (admission/webhook.py `server`, Kopf's aiohttp TLS server) on loopback, with certificates
made by the dev control plane's CA code. A caller with a client certificate from that CA is
answered; one without a certificate, or with one from another CA, is refused at the handshake, so
its forged AdmissionReview never reaches a handler (nothing it says can note a claim as pending
quota or write a template). Without the setting any caller is answered, as before."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import aiohttp
import pytest
import yaml

from rocshare_dev.devcluster import certs
from rocshare_dev.devcluster.controlplane import free_port, write_webhook_client_auth
from rocshare_operator.admission.webhook import WebhookSettings, readable_client_ca, server


def review(uid: str) -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "operation": "CREATE", "namespace": "tenant", "name": "forged",
                        "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
                        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
                        "userInfo": {"username": "system:serviceaccount:tenant:default"},
                        "object": {"metadata": {"name": "forged", "namespace": "tenant"}}}}


class World:
    def __init__(self, folder: Path) -> None:
        self.ca = certs.make_ca(folder, "callers-ca")
        self.other_ca = certs.make_ca(folder, "other-ca")
        self.serving = certs.issue(self.ca, folder, "webhook", common_name="webhook", server=True,
                                   ip_addresses=("127.0.0.1",))
        self.apiserver = certs.issue(self.ca, folder, "apiserver-client", common_name="kube-apiserver")
        self.stranger = certs.issue(self.other_ca, folder, "stranger", common_name="kube-apiserver")
        self.received: list[tuple[str, object]] = []

    async def handler(self, data: dict, *, webhook, sslpeer, headers) -> dict:
        self.received.append((data["request"]["uid"], sslpeer))
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": {"uid": data["request"]["uid"], "allowed": True}}

    def client(self, pair: certs.KeyPair | None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca.cert))
        if pair is not None:
            context.load_cert_chain(pair.cert, pair.key)
        return context


async def post(url: str, context: ssl.SSLContext, uid: str) -> dict:
    async with aiohttp.ClientSession() as session:
        async with session.post(url, data=json.dumps(review(uid)), ssl=context,
                                headers={"Content-Type": "application/json"}) as response:
            assert response.status == 200, await response.text()
            return await response.json()


async def serving(world: World, client_ca: str | None, port: int = 0, *, own_context: bool = False):
    """`own_context`: as with --webhook-tls-secret, the operator keeps the SSL context Kopf loads into."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH) if own_context else None
    settings = WebhookSettings(host="127.0.0.1", port=port, certfile=str(world.serving.cert),
                               pkeyfile=str(world.serving.key), ssl_context=context, client_ca=client_ca)
    endpoints = server(settings)(world.handler)
    config = await anext(endpoints)  # yielded once the TLS site listens
    return endpoints, config["url"].rstrip("/") + "/resourceclaims.validate.rocshare.io"


@pytest.mark.parametrize("own_context", [False, True], ids=["certificate-files", "tls-secret-context"])
async def test_only_a_caller_with_a_certificate_from_the_client_ca_is_answered(tmp_path: Path, own_context) -> None:
    world = World(tmp_path)
    endpoints, url = await serving(world, readable_client_ca(str(world.ca.cert)), own_context=own_context)
    try:
        for uid, pair in (("no-certificate", None), ("other-ca", world.stranger)):
            with pytest.raises(aiohttp.ClientError):
                await post(url, world.client(pair), uid)
        answered = await post(url, world.client(world.apiserver), "apiserver")
    finally:
        await endpoints.aclose()
    assert answered["response"] == {"uid": "apiserver", "allowed": True}
    # Both refused requests were sent before the answered one: none reached the handler.
    assert [uid for uid, _ in world.received] == ["apiserver"]
    subject = dict(pair[0] for pair in world.received[0][1]["subject"])
    assert subject["commonName"] == "kube-apiserver"


async def test_the_dev_control_planes_webhook_kubeconfig_holds_a_certificate_the_webhook_answers(
        tmp_path: Path) -> None:
    """write_webhook_client_auth (the dev control plane's opt-in): the AdmissionConfiguration points
    both webhook plugins at a kubeconfig whose user, named by the webhook's host:port as
    kube-apiserver looks it up, holds a certificate the webhook started with its client_ca answers."""
    world = World(tmp_path)
    port = free_port()
    auth = write_webhook_client_auth(tmp_path / "webhook-auth", (f"127.0.0.1:{port}",))
    admission = yaml.safe_load(auth.admission_config.read_text())
    assert admission["kind"] == "AdmissionConfiguration"
    plugins = {(p["name"], p["configuration"]["kind"], p["configuration"]["kubeConfigFile"])
               for p in admission["plugins"]}
    assert plugins == {(name, "WebhookAdmissionConfiguration", str(auth.kubeconfig))
            for name in ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook")}
    users = {u["name"]: u["user"] for u in yaml.safe_load(auth.kubeconfig.read_text())["users"]}
    user = users[f"127.0.0.1:{port}"]
    endpoints, url = await serving(world, readable_client_ca(str(auth.client_ca)), port)
    try:
        with pytest.raises(aiohttp.ClientError):  # signed by another CA than the webhook client CA
            await post(url, world.client(world.apiserver), "cluster-ca")
        answered = await post(url, world.client(certs.KeyPair(Path(user["client-certificate"]),
                                                              Path(user["client-key"]))), "apiserver")
    finally:
        await endpoints.aclose()
    assert answered["response"]["allowed"] is True
    assert [uid for uid, _ in world.received] == ["apiserver"]


async def test_without_the_setting_any_caller_is_answered_as_before(tmp_path: Path) -> None:
    world = World(tmp_path)
    endpoints, url = await serving(world, None)
    try:
        answered = await post(url, world.client(None), "no-certificate")
    finally:
        await endpoints.aclose()
    assert answered["response"]["allowed"] is True
    assert [uid for uid, _ in world.received] == ["no-certificate"]


@pytest.mark.parametrize("content", [None, b"", b"not a certificate\n"])
def test_a_missing_or_unreadable_client_ca_fails_at_start_naming_the_file(tmp_path: Path, content) -> None:
    path = tmp_path / "client-ca.crt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SystemExit, match=f"--webhook-client-ca {path}: cannot load a CA certificate"):
        readable_client_ca(str(path))
