"""The simulated cluster's controllers (virt-controller, kube-scheduler, kubelet, virt-handler, namespaces)."""

from kubesim.controllers.cluster import Cluster
from kubesim.controllers.objects import CONTAINER_DISK_ERROR

__all__ = ["CONTAINER_DISK_ERROR", "Cluster"]
