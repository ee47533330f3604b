"""`OpGraph`: a task's computation as a networkx DiGraph of operator instances.

Nodes are inputs (`in0`, `in1`, ...) and operators (`op0`, `op1`, ...) in execution order; an edge
carries data from one node to an argument (`arg` 0 is the running tensor, 1 the second operand).
Everything stored on a node is plain JSON, so a graph round-trips through a Parquet string column.
The task's precision and pass are graph attributes (`dtype`, `task_pass`), stored only when they are
not float32 forward, so a default graph's JSON is what it always was; a float node's `dtype` is
"float32" for "floating" (the sampler works in float32 on meta tensors), the task's precision is
the graph's.
"""

from __future__ import annotations

import hashlib
import json

import networkx as nx

from opsynth.catalog.params import SIZE_PARAMS
from opsynth.catalog.precision import DEFAULT_DTYPE, DEFAULT_PASS


class OpGraph:
    def __init__(self, g: nx.DiGraph | None = None):
        self.g = g if g is not None else nx.DiGraph()

    # -- building -------------------------------------------------------------------------------
    def add_input(self, shape, dtype: str = "float32", dim_names=None, role: str = "x", high: int | None = None) -> str:
        nid = f"in{sum(1 for _ in self.input_nodes())}"
        self.g.add_node(nid, kind="input", shape=list(shape), dtype=dtype, role=role,
                        dim_names=list(dim_names) if dim_names else None, high=high)
        return nid

    def add_op(self, op: str, src: str, params: dict, out_shape, in_shape, derived=None,
               operand: dict | None = None, category: str = "") -> str:
        nid = f"op{sum(1 for _ in self.op_nodes())}"
        self.g.add_node(nid, kind="op", op=op, category=category, params=dict(params), derived=dict(derived or {}),
                        operand=operand, in_shape=list(in_shape), out_shape=list(out_shape))
        self.g.add_edge(src, nid, arg=0)
        if operand and operand.get("node"):
            self.g.add_edge(operand["node"], nid, arg=1)
        return nid

    def set_kind(self, dtype: str = DEFAULT_DTYPE, task_pass: str = DEFAULT_PASS) -> None:
        """Record the task's precision (torch's name) and pass; the defaults are not stored."""
        for key, value, default in (("dtype", dtype, DEFAULT_DTYPE), ("task_pass", task_pass, DEFAULT_PASS)):
            if value == default:
                self.g.graph.pop(key, None)
            else:
                self.g.graph[key] = value

    @property
    def dtype(self) -> str:
        """The precision the task's inputs and parameters are made in (torch's name)."""
        return self.g.graph.get("dtype", DEFAULT_DTYPE)

    @property
    def task_pass(self) -> str:
        return self.g.graph.get("task_pass", DEFAULT_PASS)

    # -- reading --------------------------------------------------------------------------------
    def input_nodes(self):
        return [n for n, d in self.g.nodes(data=True) if d["kind"] == "input"]

    def op_nodes(self):
        ops = [n for n, d in self.g.nodes(data=True) if d["kind"] == "op"]
        return sorted(ops, key=lambda n: int(n[2:]))

    def ops(self) -> list[str]:
        return [self.g.nodes[n]["op"] for n in self.op_nodes()]

    def node(self, nid: str) -> dict:
        return self.g.nodes[nid]

    def output(self) -> str:
        return self.op_nodes()[-1]

    def input_specs(self) -> list[dict]:
        return [{"name": n, "shape": d["shape"], "dtype": self.dtype if d["dtype"] == "float32" else d["dtype"],
                 "role": d["role"]} for n, d in ((n, self.g.nodes[n]) for n in self.input_nodes())]

    def __len__(self) -> int:
        return len(self.op_nodes())

    # -- serialisation --------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(nx.node_link_data(self.g, edges="edges"), sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> "OpGraph":
        return cls(nx.node_link_graph(json.loads(s), directed=True, edges="edges"))

    # -- identity -------------------------------------------------------------------------------
    def signature(self) -> str:
        """Canonical signature for exact dedup: operators, their non-size attributes, operand kinds and
        the wiring, with every size (input dims, channel counts, features) normalised away."""
        parts = []
        for n in self.input_nodes():
            d = self.g.nodes[n]
            parts.append(f"{n}:{d['role']}:{d['dtype']}:r{len(d['shape'])}")
        for n in self.op_nodes():
            d = self.g.nodes[n]
            attrs = ",".join(f"{k}={'*' if k in SIZE_PARAMS else v}" for k, v in sorted(d["params"].items()))
            opnd = d.get("operand") or {}
            okind = opnd.get("kind", "-")
            if okind == "node":
                okind += ":" + opnd["node"]
            parts.append(f"{n}:{d['op']}({attrs})[{okind}]")
        if (self.dtype, self.task_pass) != (DEFAULT_DTYPE, DEFAULT_PASS):  # a kind is a task of its own
            parts.append(f"kind:{self.dtype}:{self.task_pass}")
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
