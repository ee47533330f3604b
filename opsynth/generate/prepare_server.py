"""A preparing process: ``python -m opsynth.generate.prepare_server --req-fd R --resp-fd W --config JSON``.

It builds the sampler, the catalog and the KernelBench index once, then runs the candidate stages
before verification (`candidate.prepare`) for one request at a time and answers with the plain
fields they leave (`candidate.PREPARED`). Why processes, and the asking side: `opsynth.generate.prepare`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from typing import Any

from opsynth.generate import candidate as c
from opsynth.generate.prepare import SizingPool
from opsynth.verify import protocol


def _serve(config: dict[str, Any], req_fd: int, resp_fd: int) -> int:
    """The preparing process's loop: one request at a time, an answer for each."""
    try:
        c.serialize_ast_parse()
        c._ensure_sampler(config["sampler"], {"device": config["device"]})
        ctx: dict[str, Any] = {"sampler": c._CTX["sampler"], "catalog": c._CTX["catalog"],
                               "verify_cfg": c.VerifyConfig(**config["verify"])}
        if config["kb_check"]:
            from opsynth.dedup import KernelBenchIndex

            ctx["kb"] = KernelBenchIndex.from_config(config["dedup"])
        else:
            ctx["kb"] = None
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which replaces the process
        protocol.send(resp_fd, {"event": "failed", "error": f"{type(exc).__name__}: {exc}"})
        return 1
    protocol.send(resp_fd, {"event": "ready", "pid": os.getpid()})
    while True:
        try:
            msg = protocol.recv(req_fd)
        except protocol.ProtocolClosed:  # the parent went away
            return 0
        if msg.get("op") == "exit":
            return 0
        cand = c.Candidate(index=msg["index"], seed=msg["seed"])
        try:
            budgets = msg["budgets_mb"]
            ctx["pool"] = SizingPool(config["device"], budgets["*"], budgets)
            c.prepare(ctx, cand)
            answer = {name: getattr(cand, name) for name in c.PREPARED}
        except Exception:  # noqa: BLE001 - a bug in a stage: the asking thread raises it, as it would in process
            answer = {"error": traceback.format_exc(limit=8)}
        protocol.send(resp_fd, json.loads(json.dumps(answer, default=str)))  # evidence may hold numpy scalars


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--req-fd", type=int, required=True)
    ap.add_argument("--resp-fd", type=int, required=True)
    ap.add_argument("--config", required=True, help="sampler, verify and dedup settings, kb_check, device (JSON)")
    args = ap.parse_args(argv)
    return _serve(json.loads(args.config), args.req_fd, args.resp_fd)


if __name__ == "__main__":
    sys.exit(main())
