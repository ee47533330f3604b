"""Start the reward's fork servers ahead of the first evaluation, in the background.

A cold evaluation waits first for its fork servers (torch imported, and for the full one Dynamo and
the runners: about 13 s before the first build child on the H200). A caller that knows it will
evaluate soon (the `pipelines.evaluate` command line before its own imports, a trainer as it is
built, before its first completions are sampled) starts them now, so that start overlaps its own work. Imports no torch: it
runs before the caller's torch import. A start that fails here is left to the evaluation's own
start, which reports it.
"""

from __future__ import annotations

import threading

from opsynth.reward.eval_types import BUILD_RUNNERS, RUNNERS


def prestart(cfg) -> list[threading.Thread]:
    """Begin starting the light (builds) and full (runs, timing) fork servers for `cfg`, with the
    environment `run_child` gives them (`sandbox.server_env`); returns the threads starting them."""
    from opsynth.runtime.sandbox import fork_server, server_env

    env = server_env(cfg)

    def start(warm, light):
        try:
            fork_server(env, warm, light)
        except Exception:  # noqa: BLE001 - the evaluation's own start reports it, in its own words
            pass

    threads = [threading.Thread(target=start, args=(warm, light), name=f"opsynth-prestart-{'light' if light else 'full'}",
                                daemon=True) for warm, light in ((BUILD_RUNNERS, True), (RUNNERS, False))]
    for t in threads:
        t.start()
    return threads
