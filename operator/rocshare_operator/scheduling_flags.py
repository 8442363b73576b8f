"""Command-line flags of the operator's scheduling half (kept free of heavy imports)."""

from __future__ import annotations


def add_arguments(parser) -> None:
    """The operator's scheduling flags (extender, metrics, webhook)."""
    group = parser.add_argument_group("scheduling (extender and admission webhook)")
    group.add_argument("--extender-host", default="127.0.0.1", help="extender listen address (default: %(default)s)")
    group.add_argument("--extender-port", type=int, default=31990, help="extender port (default: %(default)s)")
    group.add_argument("--extender-tls-cert", default=None, help="serve the extender over TLS with this cert")
    group.add_argument("--extender-tls-key", default=None, help="key of --extender-tls-cert")
    group.add_argument("--metrics-port", type=int, default=31993, help="scheduler metrics port (default: %(default)s)")
    group.add_argument("--bind-wait-s", type=float, default=25.0,
                       help="how long a bind waits for the node's in-flight pod (default: %(default)s s)")
    group.add_argument("--no-extender", action="store_true", help="do not run the scheduler extender")
    group.add_argument("--scheduler-lease", default=None, metavar="NAME",
                       help="decide only while the kube-scheduler beside this replica holds this Lease of "
                            "--namespace (its leaderElection.resourceName; several replicas); Kopf's reconcilers "
                            "follow it too. Default: no Lease, this replica always decides")
    group.add_argument("--scheduler-host", default=None, metavar="HOSTNAME",
                       help="the hostname kube-scheduler puts in its Lease identity (default: this host's name, "
                            "which the containers of one pod share)")
    group.add_argument("--webhook-host", default="0.0.0.0", help="webhook listen address (default: %(default)s)")
    group.add_argument("--webhook-port", type=int, default=9443, help="webhook port (default: %(default)s)")
    group.add_argument("--webhook-cert", default=None, help="TLS certificate of the webhook (PEM)")
    group.add_argument("--webhook-key", default=None, help="TLS key of the webhook (PEM)")
    group.add_argument("--webhook-tls-secret", default=None, metavar="NAME",
                       help="own the webhook's certificate: keep a self-signed CA and serving certificate in this "
                            "Secret of --namespace (made when missing, renewed before expiry), write the CA into "
                            "caBundle of the rocshare-pods webhook configurations, and serve with it "
                            "(instead of --webhook-cert/--webhook-key)")
    group.add_argument("--webhook-client-ca", default=None, metavar="FILE",
                       help="require every caller of the webhook to present a client certificate signed by a CA in "
                            "this PEM file (kube-apiserver does, given an AdmissionConfiguration kubeconfig); others "
                            "are refused at the TLS handshake. Default: any caller is answered")
    group.add_argument("--no-webhook", action="store_true", help="do not serve the admission webhook")
    group.add_argument("--scheduler-name", default="rocshare-scheduler",
                       help="schedulerName the webhook sets on GPU pods (default: %(default)s)")
    group.add_argument("--trusted-user", action="append", default=[],
                       help="a user allowed to write allocation annotations besides rocshare's service accounts "
                            "(repeatable)")

