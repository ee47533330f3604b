"""`cluster_workers` lists a cluster's workers whenever it is asked; `Client.scheduler_info()` can
answer with none after the client's periodic refresh (it asks the scheduler without workers)."""

from __future__ import annotations

from opsynth.cluster import cluster_workers


def test_the_workers_are_listed_after_the_clients_own_refresh():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        client.sync(client._update_scheduler_info)  # what the 2 s periodic callback runs
        # the hazard: the cached identity that scheduler_info() returns has lost its workers
        assert client._scheduler_identity.get("workers", {}) == {}
        workers = cluster_workers(client)
        assert len(workers) == 2
        assert all(w["nthreads"] == 1 for w in workers.values())
