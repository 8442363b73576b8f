"""A thin async adapter over kubernetes-asyncio: raw JSON requests with typed errors.

Everything rocshare stores lives in the API server, so every part talks to it the
same way: plain dicts in and out (the shapes the API documents), server-side apply
for objects a part owns, merge patches with resourceVersion preconditions where a
decision must not race, and list+watch streams for caches. Library errors are
translated here, once, into `ApiError` subclasses that say whether a retry can help.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


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


def _translate(error: ApiException) -> ApiError:
    return _error_from_reply(error.status or 0, error.reason or "", error.body or b"")


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


class Kube:
    """One API server connection. Create with `await Kube.connect(kubeconfig)`; close when done."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self._api = api_client

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
        return cls(client.ApiClient(configuration))

    async def close(self) -> None:
        await self._api.close()

    async def __aenter__(self) -> Kube:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def request(self, method: str, path: str, *, body: Any = None, query: dict[str, Any] | None = None,
                      content_type: str = "application/json", timeout_s: float = 30.0) -> dict[str, Any]:
        """One request; returns the decoded JSON reply or raises ApiError."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        # The library JSON-encodes the body for every content type we use (apply-patch+yaml
        # included: JSON is YAML), so plain dicts and lists go in as they are.
        try:
            response = await self._api.call_api(
                path, method, query_params=list((query or {}).items()), header_params=headers, body=body,
                auth_settings=["BearerToken"], _preload_content=False, _request_timeout=timeout_s,
            )
        except ApiException as error:
            raise _translate(error) from None
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise Unavailable(0, "Unreachable", str(error) or type(error).__name__) from None
        response = response[0] if isinstance(response, tuple) else response
        try:
            text = await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise Unavailable(0, "ReplyBroken", str(error) or type(error).__name__) from None
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
        try:
            response = await self._api.call_api(
                path, "GET", query_params=list(params.items()), header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"], _preload_content=False, _request_timeout=timeout_s + 30,
            )
        except ApiException as error:
            raise _translate(error) from None
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise Unavailable(0, "Unreachable", str(error) or type(error).__name__) from None
        response = response[0] if isinstance(response, tuple) else response
        if not 200 <= response.status <= 299:
            raise _error_from_reply(response.status, response.reason or "", await response.read())
        try:
            async for line in response.content:
                if line.strip():
                    event = orjson.loads(line)
                    yield WatchEvent(event["type"], event["object"])
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise Unavailable(0, "WatchBroken", str(error) or type(error).__name__) from None
        finally:
            response.release()
