"""The pod admission webhook: ``pods`` holds the pure rules (what a GPU pod is defaulted to,
what is refused and why); ``webhook`` serves them through Kopf's admission server."""
