"""The scheduler extender kube-scheduler calls: filter and prioritize (pure decisions over a
snapshot of the cluster) and bind (the one place a decision becomes real: the record and the
Binding in one write, one in-flight pod per node). Also its HTTP server, quota check, retry
of unanswered binds and metrics."""
