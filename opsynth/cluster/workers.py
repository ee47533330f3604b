"""The workers a Dask client's scheduler has now, asked for directly.

Not `Client.scheduler_info()`: the client's own periodic refresh (every 2 s) asks the scheduler for
its identity *without* workers and overwrites the cached answer that `scheduler_info()` returns, so a
synchronous call can come back with ``"workers": {}`` on a cluster with workers (distributed
2026.8; it failed the reward's cluster test in CI once). This helper keeps no cache to race with.
"""

from __future__ import annotations


def cluster_workers(client) -> dict[str, dict]:
    """{address: the scheduler's record of that worker (nthreads, resources, ...)}, all of them."""
    identity = client.sync(client.scheduler.identity, n_workers=-1)
    return dict(identity.get("workers") or {})
