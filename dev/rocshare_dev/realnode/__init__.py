"""The real-node rig: one real kubelet v1.35 with containerd, beside the local control plane,
all inside a network namespace of its own (see ../shared/real-node.md).

Pod and Service addresses (10.x) exist only inside that namespace; the machine's own network
sees nothing but loopback. The test process stays outside and reaches the API server through a
unix-socket bridge (`apibridge`). Modules, one job each:

* ``netns`` -- the namespace and running commands in it;
* ``sysctls`` -- the three kernel settings the kubelet rewrites, recorded and restored;
* ``network`` -- the cni0 bridge, the CNI conflist, the DNAT to the API server;
* ``containerd`` -- its config, process and image imports;
* ``kubelet`` -- its certificates, config, process and clean-up (mounts, cgroups);
* ``apibridge`` -- socat pair: TCP on the host's loopback <-> unix socket <-> the namespace's loopback;
* ``rig`` -- `RealNode`: up and down in order, state in ``<run>/state.json``;
* ``deploy`` -- rocshare deployed as users do (`kubectl apply --server-side -k`, images set to
  the local ones), the pool, the fake GPU host paths;
* ``__main__`` -- `rocshare-dev real-node up|down` (`make real-node-up`, `make real-node-down`).
"""
