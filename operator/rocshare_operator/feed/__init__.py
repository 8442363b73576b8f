"""The cluster feed: one list+watch per kind (Nodes, Pods, AmdGpuNodes) for the whole
operator process, decoded once per event into small frozen facts and handed to every reader
(the extender's state, the pool and share loops)."""
