"""The webhook's self-signed certificate (admission/certificate.py, pure): what is issued, when it
must be renewed, how a renewal keeps the previous CA; and the Secret keeper
(admission/tls_secret.py) against an in-memory API: created when missing, kept when good,
renewed near expiry with a guarded update, caBundle written to both configurations."""

from __future__ import annotations

import base64
import datetime
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from rocshare.kube.client import Conflict, NotFound
from rocshare_operator.admission import certificate, tls_secret
from rocshare_operator.admission.certificate import TlsBundle, issue, renewal_reason

SERVICE, NAMESPACE = "rocshare-webhook", "rocshare-system"
NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)


@pytest.fixture(scope="module")
def bundle() -> TlsBundle:
    return issue(SERVICE, NAMESPACE, now=NOW)


def test_issued_certificate_names_the_service_and_is_signed_by_the_ca(bundle: TlsBundle) -> None:
    cert = x509.load_pem_x509_certificate(bundle.cert_pem)
    ca = x509.load_pem_x509_certificate(bundle.ca_pem)
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert "rocshare-webhook.rocshare-system.svc" in sans
    assert cert.not_valid_after_utc == NOW + certificate.VALIDITY
    assert renewal_reason(bundle, SERVICE, NAMESPACE, now=NOW) is None


def test_python_ssl_serves_it_and_a_client_trusting_the_ca_accepts_it(bundle: TlsBundle, tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_bytes(bundle.cert_pem)
    (tmp_path / "tls.key").write_bytes(bundle.key_pem)
    server = ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    client = ssl.create_default_context(cadata=bundle.ca_pem.decode())
    assert client.cert_store_stats()["x509_ca"] == 1


@pytest.mark.parametrize(("days_later", "expected"), [
    (0, None), (334, None), (336, "expires"), (400, "expires"),
])
def test_renewal_thirty_days_before_expiry(bundle: TlsBundle, days_later: int, expected: str | None) -> None:
    reason = renewal_reason(bundle, SERVICE, NAMESPACE, now=NOW + datetime.timedelta(days=days_later))
    assert (reason or "").startswith(expected or "") and (reason is None) == (expected is None)


def test_renewal_reasons_for_broken_bundles(bundle: TlsBundle) -> None:
    other = issue(SERVICE, NAMESPACE, now=NOW)
    cases = {
        "missing": None,
        "unreadable": TlsBundle(ca_pem=bundle.ca_pem, cert_pem=b"garbage", key_pem=bundle.key_pem),
        "the key does not match": TlsBundle(ca_pem=bundle.ca_pem, cert_pem=bundle.cert_pem, key_pem=other.key_pem),
        "not signed by the CA": TlsBundle(ca_pem=other.ca_pem, cert_pem=bundle.cert_pem, key_pem=bundle.key_pem),
    }
    for expected, broken in cases.items():
        assert (renewal_reason(broken, SERVICE, NAMESPACE, now=NOW) or "").startswith(expected), expected
    assert renewal_reason(bundle, "another-service", NAMESPACE, now=NOW).startswith("does not name")


def test_a_renewal_keeps_the_previous_ca_second_while_it_is_valid(bundle: TlsBundle) -> None:
    renewed = issue(SERVICE, NAMESPACE, now=NOW + datetime.timedelta(days=340), previous=bundle)
    cas = x509.load_pem_x509_certificates(renewed.ca_pem)
    assert len(cas) == 2 and cas[1] == x509.load_pem_x509_certificate(bundle.ca_pem)
    x509.load_pem_x509_certificate(renewed.cert_pem).verify_directly_issued_by(cas[0])
    assert renewal_reason(renewed, SERVICE, NAMESPACE, now=NOW + datetime.timedelta(days=340)) is None
    expired_previous = issue(SERVICE, NAMESPACE, now=NOW + datetime.timedelta(days=400), previous=bundle)
    assert len(x509.load_pem_x509_certificates(expired_previous.ca_pem)) == 1


def test_secret_data_round_trip(bundle: TlsBundle) -> None:
    assert TlsBundle.from_secret_data(bundle.secret_data()) == bundle
    assert TlsBundle.from_secret_data({"tls.crt": "eA=="}) is None
    assert TlsBundle.from_secret_data({**bundle.secret_data(), "tls.key": "not base64!"}) is None


# ---- the Secret keeper against an in-memory API ------------------------------------------------


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[str, dict] = {}
        self.version = 0
        self.writes: list[str] = []
        for plural in tls_secret.WEBHOOK_CONFIGURATIONS:
            self.objects[f"/apis/admissionregistration.k8s.io/v1/{plural}/rocshare-pods"] = {
                "webhooks": [{"name": "w", "clientConfig": {"service": {}}}]}

    def _stamp(self, body: dict) -> dict:
        self.version += 1
        body.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        return body

    async def get(self, path: str) -> dict:
        if path not in self.objects:
            raise NotFound(404, "NotFound", path)
        return self.objects[path]

    async def create(self, path: str, body: dict) -> dict:
        full = f"{path}/{body['metadata']['name']}"
        if full in self.objects:
            raise Conflict(409, "AlreadyExists", full)
        self.writes.append(f"create {full}")
        self.objects[full] = self._stamp(body)
        return body

    async def request(self, method: str, path: str, *, body: dict) -> dict:
        assert method == "PUT"
        if self.objects[path]["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", path)
        self.writes.append(f"update {path}")
        self.objects[path] = self._stamp(body)
        return body

    async def json_patch(self, path: str, operations: list[dict]) -> dict:
        self.writes.append(f"patch {path}")
        for operation in operations:
            index = int(operation["path"].split("/")[2])
            self.objects[path]["webhooks"][index]["clientConfig"]["caBundle"] = operation["value"]
        return self.objects[path]


SECRET_PATH = "/api/v1/namespaces/rocshare-system/secrets/rocshare-webhook-tls"


@pytest.fixture
def settings(tmp_path: Path) -> tls_secret.TlsSecretSettings:
    return tls_secret.TlsSecretSettings(namespace=NAMESPACE, secret="rocshare-webhook-tls", folder=tmp_path / "tls")


async def test_missing_secret_is_created_and_the_ca_published(settings: tls_secret.TlsSecretSettings) -> None:
    kube = FakeKube()
    made = await tls_secret.ensure_secret(kube, settings)
    assert kube.writes == [f"create {SECRET_PATH}"]
    assert kube.objects[SECRET_PATH]["type"] == "kubernetes.io/tls"
    await tls_secret.publish_ca_bundle(kube, settings, made)
    for plural in tls_secret.WEBHOOK_CONFIGURATIONS:
        webhook = kube.objects[f"/apis/admissionregistration.k8s.io/v1/{plural}/rocshare-pods"]["webhooks"][0]
        assert base64.b64decode(webhook["clientConfig"]["caBundle"]) == made.ca_pem
    assert tls_secret.write_pair(settings, made) is True
    assert tls_secret.write_pair(settings, made) is False  # unchanged: no reload
    assert settings.key_path.stat().st_mode & 0o077 == 0


async def test_a_good_secret_is_served_as_it_is(settings: tls_secret.TlsSecretSettings) -> None:
    kube = FakeKube()
    first = await tls_secret.ensure_secret(kube, settings)
    await tls_secret.publish_ca_bundle(kube, settings, first)
    kube.writes.clear()
    assert await tls_secret.ensure_secret(kube, settings) == first
    await tls_secret.publish_ca_bundle(kube, settings, first)
    assert kube.writes == []


async def test_a_secret_near_expiry_is_renewed_with_a_guarded_update(settings: tls_secret.TlsSecretSettings,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    kube = FakeKube()
    old = issue(SERVICE, NAMESPACE, now=NOW - datetime.timedelta(days=350))
    kube.objects[SECRET_PATH] = {"metadata": {"name": "rocshare-webhook-tls", "resourceVersion": "7"},
                                 "data": old.secret_data()}
    monkeypatch.setattr(tls_secret, "_now", lambda: NOW)
    renewed = await tls_secret.ensure_secret(kube, settings)
    assert renewed != old and kube.writes == [f"update {SECRET_PATH}"]
    assert len(x509.load_pem_x509_certificates(renewed.ca_pem)) == 2  # old CA kept while valid


async def test_a_replica_that_loses_the_race_serves_the_winners_secret(settings: tls_secret.TlsSecretSettings) -> None:
    kube = FakeKube()
    winner = issue(SERVICE, NAMESPACE, now=datetime.datetime.now(datetime.UTC))
    real_create = kube.create

    async def create_after_the_winner(path: str, body: dict) -> dict:
        kube.objects[SECRET_PATH] = {"metadata": {"name": "rocshare-webhook-tls", "resourceVersion": "1"},
                                     "data": winner.secret_data()}
        return await real_create(path, body)

    kube.create = create_after_the_winner
    assert await tls_secret.ensure_secret(kube, settings) == winner
