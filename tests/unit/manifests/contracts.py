"""Contract schemas for the objects of other projects that rocshare ships (cert-manager,
Prometheus Operator, Argo CD). Their CRDs are not vendored here, so these schemas are written
from those projects' API references and cover the fields rocshare sets: required fields,
types, and closed objects where a typo would otherwise pass silently."""

from __future__ import annotations

from typing import Any

STRING = {"type": "string"}
STRINGS = {"type": "array", "items": STRING}
META = {"type": "object", "required": ["name"], "properties": {"name": STRING, "namespace": STRING}}


def _closed(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


def _top(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return _closed({"apiVersion": {"const": api_version}, "kind": {"const": kind}, "metadata": META, "spec": spec},
                   ("apiVersion", "kind", "metadata", "spec"))


ISSUER = _top("cert-manager.io/v1", "Issuer", {
    "type": "object", "minProperties": 1, "maxProperties": 1,
    "properties": {"selfSigned": {"type": "object"}, "ca": _closed({"secretName": STRING}, ("secretName",))},
    "additionalProperties": False})

CERTIFICATE = _top("cert-manager.io/v1", "Certificate", _closed({
    "secretName": STRING, "commonName": STRING, "dnsNames": STRINGS,
    "duration": {"type": "string", "pattern": r"^\d+(h|m|s)$"},
    "renewBefore": {"type": "string", "pattern": r"^\d+(h|m|s)$"},
    "privateKey": _closed({"algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]}, "size": {"type": "integer"},
                           "rotationPolicy": {"enum": ["Never", "Always"]}}),
    "usages": {"type": "array", "items": {"enum": ["server auth", "client auth", "digital signature",
                                                   "key encipherment"]}},
    "issuerRef": _closed({"name": STRING, "kind": {"enum": ["Issuer", "ClusterIssuer"]}, "group": STRING}, ("name",)),
}, ("secretName", "issuerRef")))

_ENDPOINT = _closed({
    "port": STRING, "path": STRING, "interval": {"type": "string", "pattern": r"^\d+(s|m)$"},
    "honorLabels": {"type": "boolean"},
    "relabelings": {"type": "array", "items": _closed({"sourceLabels": STRINGS, "targetLabel": STRING,
                                                         "action": STRING, "regex": STRING, "replacement": STRING})},
}, ("port",))

SERVICE_MONITOR = _top("monitoring.coreos.com/v1", "ServiceMonitor", _closed({
    "selector": _closed({"matchLabels": {"type": "object", "additionalProperties": STRING}}, ("matchLabels",)),
    "namespaceSelector": _closed({"matchNames": STRINGS}),
    "endpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT},
}, ("selector", "endpoints")))

_RULE = {"oneOf": [_closed({"alert": STRING, "expr": STRING, "for": {"type": "string", "pattern": r"^\d+(s|m|h)$"},
                             "labels": {"type": "object", "additionalProperties": STRING},
                             "annotations": {"type": "object", "additionalProperties": STRING}}, ("alert", "expr")),
                    _closed({"record": STRING, "expr": STRING,
                             "labels": {"type": "object", "additionalProperties": STRING}}, ("record", "expr"))]}

PROMETHEUS_RULE = _top("monitoring.coreos.com/v1", "PrometheusRule", _closed({
    "groups": {"type": "array", "minItems": 1, "items": _closed({
        "name": STRING, "interval": STRING, "rules": {"type": "array", "minItems": 1, "items": _RULE}},
        ("name", "rules"))},
}, ("groups",)))

APPLICATION = _top("argoproj.io/v1alpha1", "Application", _closed({
    "project": STRING,
    "source": _closed({"repoURL": STRING, "targetRevision": STRING, "path": STRING}, ("repoURL", "path")),
    "destination": _closed({"server": STRING, "namespace": STRING}, ("server",)),
    "syncPolicy": _closed({
        "automated": _closed({"prune": {"type": "boolean"}, "selfHeal": {"type": "boolean"}}),
        "syncOptions": STRINGS,
        "retry": _closed({"limit": {"type": "integer"}, "backoff": _closed({
            "duration": STRING, "factor": {"type": "integer"}, "maxDuration": STRING})}),
    }),
    "ignoreDifferences": {"type": "array", "items": _closed({
        "group": STRING, "kind": STRING, "name": STRING, "jqPathExpressions": STRINGS}, ("kind",))},
}, ("project", "source", "destination")))
# Argo CD's Application has finalizers in metadata; allowed by META's open properties.

BY_KIND = {("cert-manager.io", "Issuer"): ISSUER, ("cert-manager.io", "Certificate"): CERTIFICATE,
           ("monitoring.coreos.com", "ServiceMonitor"): SERVICE_MONITOR,
           ("monitoring.coreos.com", "PrometheusRule"): PROMETHEUS_RULE,
           ("argoproj.io", "Application"): APPLICATION}
