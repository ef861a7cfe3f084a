"""Logs that nodes without the launcher's filesystem send back (`POST .../node-logs`).

A Slurm node that does not see the job directory runs its ranks in a directory of its own
(node/slurm_node.py) and sends each new line of their `rank-R.log` and of its agent's
`node-K.log` here; the lines are appended to the attempt's files of the same names, so the
logs route, alert rules, diagnosis and evidence read them as on every engine.

What a sender can reach is fixed here, not by the body: the job's current attempt directory
(an earlier attempt's sender is answered stale and writes nothing), its own node's log and
its own node's ranks' logs (a rank number is checked against the node's range), file names
made from those integers alone. Rank logs are capped as the ranks' own are
(`layout.CappedLog`, $DLC_RANK_LOG_MIB): a sender that never stops printing keeps the head
and a rolling tail, and cannot fill the disk the store is on.
"""

from __future__ import annotations

import os
from typing import Any

from .. import layout
from ..spec import SpecError


def check(body: dict[str, Any], nodes: int, nproc_per_node: int) -> None:
    """SpecError naming the field a node may not write (another node, a rank not its own,
    more text than a body may carry)."""
    node = body["node"]
    if node >= nodes:
        raise SpecError("node", f"node {node} does not exist in a job of {nodes} node(s) "
                                f"(nodes 0-{nodes - 1})")
    first = node * nproc_per_node
    size = 0
    for index, entry in enumerate(body["logs"]):
        rank = entry.get("rank")
        if rank is not None and not first <= rank < first + nproc_per_node:
            raise SpecError(f"logs[{index}].rank", f"rank {rank} does not run on node {node} "
                                                   f"(its ranks are {first}-{first + nproc_per_node - 1})")
        size += len(entry["text"].encode("utf-8", "surrogatepass"))
    from ..bodies import NODE_LOG_BYTES

    if size > NODE_LOG_BYTES:
        raise SpecError("logs", f"{size} bytes of text; at most {NODE_LOG_BYTES} a request, "
                                "send the rest in the next")


def append(attempt_dir: str, body: dict[str, Any]) -> None:
    """The body's lines appended to the attempt's files, each file written once."""
    texts: dict[str, list[str]] = {}
    for entry in body["logs"]:
        rank = entry.get("rank")
        path = layout.node_log(attempt_dir, body["node"]) if rank is None else layout.rank_log(attempt_dir, rank)
        texts.setdefault(path, []).append(entry["text"])
    os.makedirs(attempt_dir, exist_ok=True)
    for path, parts in texts.items():
        data = "".join(parts).encode("utf-8", "replace")
        if not data:
            continue
        log = layout.CappedLog(path, layout.log_cap())
        try:
            log.write(data)
        finally:
            log.close()
