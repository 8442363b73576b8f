"""The node agent as a DRA driver (gpu.rocshare.io): ResourceSlice publishing and the kubelet plugin."""
