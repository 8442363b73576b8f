"""The local control plane's certificates (rocshare_dev.devcluster.certs) pass a strict TLS
client: Python 3.13, the images' Python on Debian 13, sets VERIFY_X509_STRICT by default and
refuses a server certificate without an authority key identifier. A real TLS handshake on
loopback, with the flag set explicitly so the test means the same on any Python."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

from rocshare_dev.devcluster import certs


def test_a_strict_client_accepts_the_api_servers_certificate(tmp_path: Path) -> None:
    ca = certs.make_ca(tmp_path, "ca")
    served = certs.issue(ca, tmp_path, "apiserver", common_name="kube-apiserver", server=True,
                         dns_names=("localhost",), ip_addresses=("127.0.0.1",))
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(served.cert, served.key)
    client_context = ssl.create_default_context(cafile=str(ca.cert))
    client_context.verify_flags |= ssl.VERIFY_X509_STRICT
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        errors: list[BaseException] = []

        def serve() -> None:
            connection, _ = listener.accept()
            try:
                with server_context.wrap_socket(connection, server_side=True) as tls:
                    tls.recv(1)
            except (ssl.SSLError, OSError) as error:  # reported below; the client's error says more
                errors.append(error)

        thread = threading.Thread(target=serve)
        thread.start()
        with socket.create_connection(("127.0.0.1", port)) as raw, \
                client_context.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(b"x")
        thread.join(timeout=10)
    assert not errors, errors
