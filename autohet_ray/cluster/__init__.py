from autohet_ray.cluster.catalog import CATALOG, DeviceType, lookup
from autohet_ray.cluster.spec import Cluster, Node, cluster_from_dict, load_cluster

__all__ = ["CATALOG", "DeviceType", "lookup", "Cluster", "Node", "cluster_from_dict", "load_cluster"]
