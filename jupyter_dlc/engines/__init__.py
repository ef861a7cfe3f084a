"""Engines: where a job's ranks run (this machine, Slurm, SSH hosts, Kubernetes), each a
package behind one contract.

    contract.py     the Engine interface, its typed records (DryRun, AttemptStatus,
                    Capabilities) and the one instance per engine (`get_engine`)
    registry.py     which engines exist: the entry-point group `jupyter_dlc.engines`
    local/ slurm/ ssh/ kubernetes/
                    one engine each: its engine (engine.py), its native request, its
                    export form, its pool driver (pool.py) and its profile options
    torchrun.py     the torchrun command line every engine runs, and its failure summary
    remote_env.py   the job's environment for nodes the launcher does not start itself
    children.py     processes the engines start here, and their reaping
    pool_files.py   a warm pool's file protocol with its agents (node/pool_agent.py)
    staging.py      the job's files for nodes that do not share the launcher's filesystem
    features.py     the table of what each engine can do (ARCHITECTURE.md)

What runs on the nodes themselves is `jupyter_dlc/node/`; this machine's processes as jobs
(cgroups, slots, kills) is `jupyter_dlc/hostprocs.py`. Imports nothing here, so that the
registry can be read (spec, clusters) without loading any engine.
"""
