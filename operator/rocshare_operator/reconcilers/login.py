"""How Kopf logs in: from the kubeconfig the operator was given, else in-cluster.

Kopf's built-in kubeconfig login reads only $KUBECONFIG; ours takes the path from
``memo.rocshare.kubeconfig`` and lets kubernetes-asyncio parse it, so client
certificates, tokens and exec plugins work as they do for the `Kube` client.
"""

from __future__ import annotations

from typing import Any

import kopf
from kubernetes_asyncio import client, config


@kopf.on.login()
async def login(memo: kopf.Memo, **kwargs: Any) -> kopf.ConnectionInfo | None:
    kubeconfig = getattr(memo.get("rocshare"), "kubeconfig", None)
    if kubeconfig is None:
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
    configuration = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return connection_info(configuration)


def connection_info(configuration: client.Configuration) -> kopf.ConnectionInfo:
    header = configuration.api_key.get("BearerToken") or configuration.api_key.get("authorization") or ""
    scheme, _, token = header.partition(" ")
    return kopf.ConnectionInfo(
        server=configuration.host, ca_path=configuration.ssl_ca_cert, insecure=not configuration.verify_ssl,
        certificate_path=configuration.cert_file, private_key_path=configuration.key_file,
        scheme=scheme or None, token=token or None,
    )
