"""The cluster room: Dask cluster profiles (`profiles`: local, local_cuda, scheduler, Slurm) and the
Slurm lifecycle (`slurm`). Generate and the reward's cluster mode start their clusters here."""

from opsynth.cluster.profiles import (
    KINDS,
    ClusterConfig,
    ClusterError,
    ClusterHandle,
    ClusterLost,
    start_cluster,
    visible_gpus,
)
from opsynth.cluster.workers import cluster_workers

__all__ = ["KINDS", "ClusterConfig", "ClusterError", "ClusterHandle", "ClusterLost", "start_cluster", "visible_gpus", "cluster_workers"]
