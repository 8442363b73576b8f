"""A thin async adapter to the API server: raw JSON requests with typed errors.

Everything rocshare stores lives in the API server, so every part talks to it the
same way: plain dicts in and out (the shapes the API documents), server-side apply
for objects a part owns, merge patches with resourceVersion preconditions where a
decision must not race, and list+watch streams for caches. Library errors are
translated here, once, into `ApiError` subclasses that say whether a retry can help.

kubernetes-asyncio reads the kubeconfig or the in-cluster service account (server, TLS
files, the bearer token and its refresh); the requests themselves go straight through one
aiohttp session, bodies encoded and replies decoded with orjson. The generated client's
request path (parameter sanitising, its own JSON, a session whose idle connections close
after 15 s) cost the extender's bind about a millisecond of CPU per pod, and a node agent
that writes every 30-60 s a fresh TLS handshake -- on both ends -- nearly every time.
"""

from __future__ import annotations

import os
import ssl
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
import orjson
from kubernetes_asyncio import client, config

APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
IDLE_CONNECTION_KEEP_S = 75.0
"""How long an idle connection is kept for the next request: longer than a node agent's pause
between writes, shorter than kube-apiserver's own idle timeout (90 s), so a kept connection is
never one the server has just closed."""
CONNECTIONS_MAX = 64
"""Connections at once (each watch holds one for its whole life)."""
READ_BUFFER_BYTES = 2**21
"""One watch event may carry an object near etcd's 1.5 MiB limit."""


class ApiError(Exception):
    """The API server refused a request. `temporary` says whether retrying may help."""

    temporary = False

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    """A precondition (resourceVersion, uid) failed, or the object exists: re-read and decide again."""

    temporary = True


class Invalid(ApiError):
    pass


class Forbidden(ApiError):
    pass


class Unavailable(ApiError):
    temporary = True


def _error_for(status: int, reason: str, message: str) -> ApiError:
    kind: type[ApiError] = {404: NotFound, 409: Conflict, 422: Invalid, 403: Forbidden}.get(status, ApiError)
    if status in (429, 500, 502, 503, 504) or status == 0:
        kind = Unavailable
    return kind(status, reason, message)


def _error_from_reply(status: int, reason: str, body: bytes | str) -> ApiError:
    """The API server's Status object names the reason and the offending fields; keep both."""
    try:
        decoded = orjson.loads(body or b"{}")
        return _error_for(status, decoded.get("reason", reason), decoded.get("message", ""))
    except (ValueError, AttributeError):
        return _error_for(status, reason, body.decode(errors="replace") if isinstance(body, bytes) else str(body))


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK, ERROR
    object: dict[str, Any]


def object_path(api_version: str, plural: str, name: str | None = None, *, namespace: str | None = None,
                subresource: str | None = None) -> str:
    """The REST path of a collection or object: core group under /api, others under /apis."""
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    parts = [prefix]
    if namespace:
        parts.append(f"namespaces/{quote(namespace)}")
    parts.append(plural)
    if name:
        parts.append(quote(name))
    if subresource:
        parts.append(subresource)
    return "/".join(parts)


class Connection:
    """The session and credentials every request of one `Kube` goes through."""

    def __init__(self, configuration: client.Configuration) -> None:
        self.configuration = configuration
        self.host = configuration.host.rstrip("/")
        self.server_hostname = configuration.tls_server_name or None
        connector = aiohttp.TCPConnector(limit=CONNECTIONS_MAX, keepalive_timeout=IDLE_CONNECTION_KEEP_S,
                                         ssl=_ssl_context(configuration) if self.host.startswith("https") else False)
        # The proxy is found once: aiohttp's trust_env looks the environment (and ~/.netrc) up again
        # in a worker thread on every request, two thread hops per request.
        self.proxy = configuration.proxy or _env_proxy(self.host)
        self.session = aiohttp.ClientSession(connector=connector, proxy=self.proxy, read_bufsize=READ_BUFFER_BYTES)

    async def headers(self, accept: str, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": accept}
        if content_type is not None:
            headers["Content-Type"] = content_type
        if "BearerToken" in self.configuration.api_key:  # the library refreshes a rotated token here
            headers["Authorization"] = await self.configuration.get_api_key_with_prefix("BearerToken")
        return headers

    async def close(self) -> None:
        await self.session.close()


def _env_proxy(host: str) -> str | None:
    """The proxy HTTPS_PROXY / HTTP_PROXY name for the API server, unless NO_PROXY exempts it."""
    parsed = urlsplit(host)
    if urllib.request.proxy_bypass(parsed.hostname or ""):
        return None
    return urllib.request.getproxies().get(parsed.scheme)


def _ssl_context(configuration: client.Configuration) -> ssl.SSLContext:
    """As kubernetes-asyncio builds it from the kubeconfig: the cluster's CA, a client certificate, its
    verification switches."""
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if configuration.disable_strict_ssl_verification:
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    return context


class Kube:
    """One API server connection. Create with `await Kube.connect(kubeconfig)`; close when done."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    @classmethod
    async def connect(cls, kubeconfig: str | os.PathLike[str] | None = None) -> Kube:
        """From a kubeconfig file, or the in-cluster service account when none is given and one exists."""
        configuration = client.Configuration()
        if kubeconfig:
            await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
        else:
            try:
                config.load_incluster_config(client_configuration=configuration)
            except config.ConfigException:
                await config.load_kube_config(client_configuration=configuration)
        return cls(Connection(configuration))

    async def close(self) -> None:
        await self._connection.close()

    async def __aenter__(self) -> Kube:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def request(self, method: str, path: str, *, body: Any = None, query: dict[str, Any] | None = None,
                      content_type: str = "application/json", timeout_s: float = 30.0) -> dict[str, Any]:
        """One request; returns the decoded JSON reply or raises ApiError. Bodies are JSON for every
        content type used here (apply-patch+yaml included: JSON is YAML)."""
        connection = self._connection
        headers = await connection.headers("application/json", content_type if body is not None else None)
        try:
            async with connection.session.request(
                    method, connection.host + path, params=_params(query), headers=headers,
                    data=orjson.dumps(body) if body is not None else None, server_hostname=connection.server_hostname,
                    timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
                text = await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise Unavailable(0, "Unreachable", str(error) or type(error).__name__) from None
        if not 200 <= response.status <= 299:
            raise _error_from_reply(response.status, response.reason or "", text)
        return orjson.loads(text) if text else {}

    async def get(self, path: str) -> dict[str, Any]:
        return await self.request("GET", path)

    async def list(self, path: str, **query: Any) -> dict[str, Any]:
        return await self.request("GET", path, query=query)

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.request("POST", path, body=body)

    async def delete(self, path: str, *, missing_ok: bool = True) -> dict[str, Any]:
        try:
            return await self.request("DELETE", path)
        except NotFound:
            if missing_ok:
                return {}
            raise

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        """RFC 7386 merge patch; put metadata.resourceVersion in the patch to make it conditional."""
        return await self.request("PATCH", path, body=patch, content_type=MERGE_PATCH)

    async def json_patch(self, path: str, operations: list[dict[str, Any]]) -> dict[str, Any]:
        """RFC 6902 patch; a `test` operation makes it conditional."""
        return await self.request("PATCH", path, body=operations, content_type=JSON_PATCH)

    async def apply(self, path: str, body: dict[str, Any], *, field_manager: str, force: bool = True) -> dict[str, Any]:
        """Server-side apply: `body` is the whole intent of `field_manager` for the object."""
        query = {"fieldManager": field_manager, "force": "true" if force else "false"}
        return await self.request("PATCH", path, body=body, query=query, content_type=APPLY_PATCH)

    async def watch(self, path: str, *, resource_version: str, timeout_s: int = 300,
                    **query: Any) -> AsyncIterator[WatchEvent]:
        """Stream watch events from `resource_version` until the server ends the watch."""
        params = {**query, "watch": "true", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                  "timeoutSeconds": str(timeout_s)}
        connection = self._connection
        try:
            response = await connection.session.get(
                connection.host + path, params=_params(params), headers=await connection.headers("application/json"),
                server_hostname=connection.server_hostname, timeout=aiohttp.ClientTimeout(total=timeout_s + 30))
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise Unavailable(0, "Unreachable", str(error) or type(error).__name__) from None
        try:
            if not 200 <= response.status <= 299:
                raise _error_from_reply(response.status, response.reason or "", await response.read())
            async for line in response.content:
                if line.strip():
                    event = orjson.loads(line)
                    yield WatchEvent(event["type"], event["object"])
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise Unavailable(0, "WatchBroken", str(error) or type(error).__name__) from None
        finally:
            response.release()


def _params(query: dict[str, Any] | None) -> list[tuple[str, str]]:
    """Query parameters as the API server reads them (booleans lower-case, as Go parses them)."""
    if not query:
        return []
    return [(key, ("true" if value else "false") if isinstance(value, bool) else str(value))
            for key, value in query.items() if value is not None]
