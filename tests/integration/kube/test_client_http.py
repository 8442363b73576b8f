"""The API client (rocshare.kube.client) against a local HTTP server playing the API server: what
goes on the wire (method, path, query as Go parses it, JSON body, content type, a bearer token read
afresh through the library's refresh hook), typed errors from the server's Status, broken
connections as Unavailable, and watch streams as events. The real API server is in tests/e2e."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from rocshare.kube.client import MERGE_PATCH, Conflict, Connection, Invalid, Kube, NotFound, Unavailable, _env_proxy


class ApiServer:
    """Answers from a script and records every request."""

    def __init__(self) -> None:
        self.seen: list[dict] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append({"method": request.method, "path": request.path, "query": dict(request.query),
                          "type": request.headers.get("Content-Type"), "auth": request.headers.get("Authorization"),
                          "body": json.loads(body) if body else None})
        if request.path.endswith("/conflict"):
            return web.json_response({"kind": "Status", "reason": "Conflict", "message": "the object has been modified"},
                                     status=409)
        if request.path.endswith("/invalid"):
            return web.json_response({"kind": "Status", "reason": "Invalid", "message": "spec.x: Required value"},
                                     status=422)
        if request.path.endswith("/gone"):
            return web.Response(status=404, text="404 page not found")
        if request.query.get("watch") == "true":
            reply = web.StreamResponse()
            await reply.prepare(request)
            for kind, name in (("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "b")):
                await reply.write(json.dumps({"type": kind, "object": {"metadata": {"name": name}}}).encode() + b"\n")
            await reply.write(b"\n")  # keep-alive blank lines are skipped
            return reply
        return web.json_response({"kind": "Pod", "metadata": {"name": "p"}})


@pytest.fixture
async def kube() -> AsyncIterator[tuple[Kube, ApiServer, list[int]]]:
    server = ApiServer()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
    configuration.api_key = {"BearerToken": "token-1"}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    refreshed = [0]

    def refresh(conf: client.Configuration) -> None:  # as the in-cluster loader rotates the token
        refreshed[0] += 1
        conf.api_key["BearerToken"] = f"token-{refreshed[0]}"

    configuration.refresh_api_key_hook = refresh
    api = Kube(Connection(configuration))
    try:
        yield api, server, refreshed
    finally:
        await api.close()
        await runner.cleanup()


async def test_requests_go_out_as_the_api_server_reads_them(kube) -> None:
    api, server, refreshed = kube
    assert (await api.list("/api/v1/pods", fieldSelector="spec.nodeName=n1", limit=500, watch=False))["kind"] == "Pod"
    await api.merge_patch("/api/v1/namespaces/ns/pods/p", {"metadata": {"annotations": {"k": "ü"}}})
    await api.apply("/apis/rocshare.io/v1alpha1/amdgpunodes/n1/status", {"status": {}}, field_manager="agent")
    listed, patched, applied = server.seen
    assert listed["method"] == "GET" and listed["query"] == {"fieldSelector": "spec.nodeName=n1", "limit": "500",
                                                              "watch": "false"}
    assert listed["type"] is None and listed["body"] is None
    assert patched["method"] == "PATCH" and patched["type"] == MERGE_PATCH
    assert patched["body"] == {"metadata": {"annotations": {"k": "ü"}}}
    assert applied["query"] == {"fieldManager": "agent", "force": "true"}
    assert applied["type"] == "application/apply-patch+yaml"
    assert [seen["auth"] for seen in server.seen] == ["Bearer token-1", "Bearer token-2", "Bearer token-3"]
    assert refreshed == [3]  # the hook is asked on every request: a rotated token is never stale


async def test_the_servers_status_becomes_a_typed_error(kube) -> None:
    api, _server, _ = kube
    with pytest.raises(Conflict, match="the object has been modified"):
        await api.create("/api/v1/namespaces/ns/pods/p/conflict", {"kind": "Binding"})
    with pytest.raises(Invalid, match="spec.x: Required value"):
        await api.create("/api/v1/namespaces/ns/pods/invalid", {})
    with pytest.raises(NotFound, match="404 page not found"):
        await api.get("/api/v1/gone")
    assert await api.delete("/api/v1/gone") == {}  # missing_ok


async def test_watch_events_in_order_and_a_dead_server_is_unavailable(kube) -> None:
    api, server, _ = kube
    events = [(event.type, event.object["metadata"]["name"])
              async for event in api.watch("/api/v1/pods", resource_version="7", timeout_s=5)]
    assert events == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "b")]
    assert server.seen[-1]["query"] == {"watch": "true", "resourceVersion": "7", "allowWatchBookmarks": "true",
                                        "timeoutSeconds": "5"}
    dead = Kube(Connection(client.Configuration(host="http://127.0.0.1:9")))
    try:
        with pytest.raises(Unavailable):
            await dead.get("/api/v1/pods")
    finally:
        await dead.close()


def test_the_proxy_is_the_environments_unless_the_api_server_is_exempt(monkeypatch) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert _env_proxy("https://10.0.0.1:6443") is None
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    assert _env_proxy("https://10.0.0.1:6443") == "http://proxy:3128"
    monkeypatch.setenv("NO_PROXY", "10.0.0.1")
    assert _env_proxy("https://10.0.0.1:6443") is None
