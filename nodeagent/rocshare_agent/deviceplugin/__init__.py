"""The kubelet device plugin for ``amd.com/gpu``: turns a committed allocation into a container.

Pure parts: `devices` (the device IDs the kubelet sees), `preferred` (which IDs to suggest),
`inflight` (which pod a request belongs to, and which of its containers), `container_spec`
(the environment, devices and mounts a container receives). Adapters: `service` (the gRPC
handlers as plain async functions), `pods` (the node's pods, from the API server), `dmem`
(the cgroup VRAM cap), `server` (the unix-socket server and its registration with the kubelet).

The generated protobuf stubs (`deviceplugin_pb2*.py`) are committed; regenerate them with the
command in `deviceplugin.proto` after editing it.
"""
