"""Programs that run on a job's nodes, beside its ranks, started by the engines: the node
reporter (reporter.py), the SSH node's two ends (ssh_node.py), a Slurm node without the
launcher's filesystem (slurm_node.py), a warm pool's zygotes (pool_agent.py) and the ranks
they fork (warm_ranks.py), the local engine's standby agents (standby.py), and preflight
on a node (preflight.py). Node programs import no engine and no launcher module (the
engines import them); `runtime/` is what runs inside a rank.
"""
