"""Slurm engine: one `sbatch --parsable` per attempt, one torchrun agent per node via `srun`.

Facts and where they come from:
- phase and the engine's reason: `squeue --json` (PENDING with Slurm's reason: Resources,
  Priority, QOS...; CANCELLED by a `scancel` from outside);
- per-node exits: the `node-K.exit` file each node's task writes in the attempt directory,
  which the nodes share with the launcher for it and for the logs (the profile says
  `shared_filesystem: true`); per-rank pids, exits and first errors: the records the ranks
  send over the report route (`DLC_RANK_RECORDS=report`: they write no record files);
- Slurm forgets an ended job after MinJobAge, so the end state the launcher saw is kept in
  the attempt directory (`slurm-state.json`), and a job Slurm no longer knows has ended.

The handle stores the Slurm job id (`engine_id`), so a launcher killed with -9 re-adopts the
job: it only ever asks Slurm about that id. A launcher killed before it stored the id finds
the job by its name (`adopt`, `dlc-<job>-a<N>`, which the supervisor recorded as the
attempt's intent before sbatch ran), and only that job's node exits count (each carries its
Slurm job id). The batch script is standalone (`dry_run`), and
`render_sbatch` also writes the `job.sbatch` of every exported bundle.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from ... import layout, shell
from ...node import reporter as node_reporter
from ...node import slurm_node
from ...node.slurm_node import STEP_VARS
from ...spec import JobSpec
from .. import children, staging
from ..contract import (
    AttemptContext,
    AttemptStatus,
    Capabilities,
    DryRun,
    Engine,
    NodeStatus,
    Phase,
    RankStatus,
    SubmitError,
    failed_preflight,
    rank_records,
    remove_preflight_markers,
    unreachable_launcher,
)
from ...engine_registry import Option
from ..remote_env import job_script_env
from ..torchrun import agent_summary_codes, node_agent_argv, torchrun_argv
from .commands import (
    ACTIVE,
    POLL_INTERVAL,
    client_env,
    profile_of,
    run_slurm,
    sbatch,
    sbatch_directives,
)

# Slurm refuses a batch script over its max_script_size (SchedulerParameters; 4 MiB unless an
# admin raised it): what the job's files may take inside one, encoded, leaving room for the rest.
SCRIPT_PAYLOAD_LIMIT = 4 * 2**20 - 64 * 2**10
BATCH_SCRIPT = "job.sbatch"  # in the attempt directory, and in an exported bundle
PAYLOAD_END = "DLC_PAYLOAD_END"  # the heredoc's end: no base64 line can be it (`_`)
CLEANUP_WAIT = 5.0  # seconds a killed job's batch shell gets to remove the nodes' copies
SETTLE = 2.0  # seconds a COMPLETING job may take to show how it ended (CANCELLED...)
# End states decided by Slurm (or an admin), not by the ranks: they name the attempt's end.
ENGINE_ENDS = {"CANCELLED": "was cancelled outside the launcher (scancel)",
               "TIMEOUT": "reached its Slurm time limit", "NODE_FAIL": "lost a node (NODE_FAIL)",
               "PREEMPTED": "was preempted by Slurm", "BOOT_FAIL": "failed to boot its nodes",
               "DEADLINE": "passed its deadline", "OUT_OF_MEMORY": "ran out of memory (Slurm)"}


def _batch_exit(slurm: dict) -> int | None:
    """The batch script's exit code as squeue gives it (a wait status: code << 8)."""
    status = slurm.get("exit_code")
    if isinstance(status, dict):  # newer Slurm: {"status": ..., "return_code": N}
        status = status.get("return_code")
        return status if isinstance(status, int) else None
    return status >> 8 if isinstance(status, int) and not isinstance(status, bool) else None


def read_owned_exit(path: str, engine_id: str) -> int | None:
    """A node's exit code as its task recorded it (`<code> <Slurm job id>`), honoured only
    when the Slurm job that wrote it is the attempt's own: a duplicate submission of the
    same attempt (a launcher killed before it stored the id) writes into the same attempt
    directory, and its exit says nothing about the job the attempt owns. A record without
    an id was written by a batch script of an earlier version, which named no other job."""
    try:
        with open(path) as f:
            words = f.read().split()
    except OSError:
        return None
    if not words or (len(words) > 1 and words[1] != engine_id):
        return None
    try:
        return int(words[0])
    except ValueError:
        return None


def reported_exits(events: list[dict[str, Any]], nodes: int, engine_id: str) -> dict[int, int | None]:
    """Node exits as the nodes reported them (`node_exit` events), honoured, as
    `read_owned_exit` does for files, only from the attempt's own Slurm job: a duplicate
    submission of the attempt reports with the same token, under another job id."""
    exits: dict[int, int | None] = dict.fromkeys(range(nodes))
    for event in events:
        node, code = event.get("node"), event.get("exit_code")
        if event.get("type") == layout.NODE_EXIT and event.get("engine_id") == engine_id and \
                isinstance(node, int) and node in exits and isinstance(code, int):
            exits[node] = code
    return exits


@dataclass
class Staged:
    """The job's files inside the batch script, for nodes that do not see the job directory
    (`shared_filesystem: false`): `payload` is `slurm_node.encode_payload`'s base64 lines;
    `job_dir` and `cwd` are the launcher's paths, which each node points into its own copy."""

    job_dir: str
    cwd: str
    payload: str
    copies: str  # the prefix of the nodes' copies: dlc-<job>-a<N>-n (slurm_node, ssh_node.stage)

    def lines(self, srun: str) -> str:
        """Shell text: the payload into a file of the batch host's, opened twice (the stdin of
        the preflight step and of the agents' step: srun hands it to every task on every node)
        and unlinked at once, so that nothing of it is left however the job ends. Base64 and
        a quoted heredoc: nothing in it is shell. Then `clean_nodes`, a step that removes
        the nodes' copies of the job directory, for a task killed before it could (the
        launcher's kill signals the steps alone, so this shell lives to run it)."""
        clean = f'rm -rf -- "${{TMPDIR:-/tmp}}"/{shell.quote(self.copies)}"$SLURM_NODEID"-*'
        return "\n".join(['payload="$(mktemp)"', f"cat > \"$payload\" <<'{PAYLOAD_END}'", self.payload,
                          PAYLOAD_END, 'exec 3< "$payload" 4< "$payload"', 'rm -f "$payload"',
                          f"clean_nodes() {{ {srun}{shell.quote(clean)} < /dev/null; }}"])


def payload_error(spec: JobSpec, cluster: str) -> str | None:
    """The one-line refusal of a job whose files do not fit in a batch script, else None."""
    problem = staging.size_error(spec, cluster, "inside the batch script", "nodes")
    if problem:
        return problem
    try:
        size = len(slurm_node.encode_payload(staging.spec_files(spec)))
    except OSError as error:
        return f"files: cannot read {error.filename}: {error.strerror}"
    if size <= SCRIPT_PAYLOAD_LIMIT:
        return None
    return (f"files: the script and pushed files take {size / 2**20:.1f} MiB compressed and encoded, "
            f"over the {SCRIPT_PAYLOAD_LIMIT / 2**20:.1f} MiB a batch script of cluster {cluster} "
            "carries (Slurm's max_script_size is 4 MiB; shared_filesystem: false); push less, or "
            "share a filesystem with the nodes")


def render_sbatch(spec: JobSpec, directives: list[str], exports: list[str], python: str,
                  script: str, log_dir: str, port: str, slots: dict[str, str] | None = None,
                  preamble: str = "", bootstrap: bool = True, preflight: bool = False,
                  umask: int = -1, staged: Staged | None = None) -> str:
    """A batch script that runs the job's torchrun agents, one per node.

    `python`, `script` and `log_dir` are values (quoted here, through `shell`), where
    `shell.slot(NAME)` stands for the shell text `slots[NAME]` (the export's "$HERE"...);
    `exports` are whole lines (`shell.export...`) and `port` a shell word of our own.
    Without `bootstrap` the ranks run the script as plain torchrun would (no jupyter-dlc
    needed). A `umask` of 0 or more is the one the ranks get (the user's, not the launcher's).
    With `staged` (nodes without the launcher's filesystem) the job's files travel inside
    the script and each node's task is `slurm_node` (see there), which takes them on stdin.
    """
    slots = dict(slots or {}, NODE='"$node"', MASTER='"$MASTER_ADDR"', PORT='"$MASTER_PORT"')
    node_log = shell.word(layout.node_log(log_dir, shell.slot("NODE")), slots)
    node_exit = shell.word(layout.node_exit(log_dir, shell.slot("NODE")), slots)
    if bootstrap:
        # As on the local engine, the node's agent imports torch once and forks its ranks
        # (torchrun.forked_start_wanted). Its own exit record goes nowhere: the task below
        # writes the node's, with the Slurm job's id.
        argv = node_agent_argv(spec, shell.slot("NODE"), shell.slot("PORT"), script, python,
                               os.devnull, master_addr=shell.slot("MASTER"))
    else:
        argv = torchrun_argv(spec, shell.slot("NODE"), shell.slot("PORT"), script, python,
                             master_addr=shell.slot("MASTER"))
        cut = argv.index("jupyter_dlc.runtime.bootstrap")
        argv = argv[:cut - 1] + argv[cut + 1:]
    agent = shell.command(argv, slots)
    python_word = shell.word(python, slots)
    # Slurm gives each step the umask sbatch was called with (SLURM_UMASK): the launcher's
    # 077, unless the script says otherwise; the ranks get the user's, as local ones do.
    mask = "" if umask < 0 else f"umask {umask:04o}\n"
    reporter = ""
    if bootstrap and node_reporter.wanted(spec.nproc_per_node):
        # The node's ranks report through one node reporter, which leaves with this shell
        # (and Slurm ends it with the step in any case).
        reporter = node_reporter.shell_start(
            python_word, shell.word(node_reporter.url_file(log_dir, shell.slot("NODE")), slots))
    head = [mask + 'node="$SLURM_NODEID"', f"unset {' '.join(STEP_VARS)}", 'export DLC_NODE_RANK="$node"']
    if staged:
        # Everything of the node (its files, logs, exit) goes through slurm_node; it stays
        # through a stop's SIGTERM itself, to send the last lines and the exit. Its copy of
        # the job directory goes where clean_nodes looks.
        head.append('export TMPDIR="${TMPDIR:-/tmp}"')
        node_argv = [python, "-m", "jupyter_dlc.node.slurm_node", "run", staged.job_dir, staged.cwd, "--"]
        task = "\n".join([*head, f"exec {shell.command(node_argv, slots)} {agent}"])
    else:
        task = "\n".join([
            *head,
            # Slurm ends a step (killing what is left) when its task exits: this shell must
            # outlive the agent it runs, through the SIGTERM of a stop, for the ranks' grace.
            # A handler, not an ignore: an ignored signal would stay ignored in the agent.
            "trap : TERM",
            f'{reporter}{agent} >> {node_log} 2>&1',
            "rc=$?",
            # The launcher's exit record names the Slurm job that wrote it (read_owned_exit):
            # only the attempt's own counts. An exported bundle's is the bare code.
            f'echo "$rc{" $SLURM_JOB_ID" if bootstrap else ""}" > {node_exit}',
            'exit "$rc"',
        ])
    srun = (f"srun --nodes={spec.nodes} --ntasks={spec.nodes} --ntasks-per-node=1 "
            "--kill-on-bad-exit=0 \\\n    /bin/bash -c ")
    checks = ""
    if preflight:
        # Preflight where the ranks run: one task per node, before any agent; a node that
        # fails reports why (node_preflight event) and no agent starts anywhere.
        check_argv = ([python, "-m", "jupyter_dlc.node.slurm_node", "preflight", staged.job_dir, staged.cwd]
                      if staged else [python, "-m", "jupyter_dlc.node.preflight"])
        node_check = "\n".join([*head, f"exec {shell.command(check_argv, slots)}"])
        # The batch exits PREFLIGHT_UNREACHABLE when a node could not deliver its verdict
        # (Slurm keeps that code; no event will say it), else 3.
        failed = (f'{{ rc=$?; {"clean_nodes; " if staged else ""}[ "$rc" = {layout.PREFLIGHT_UNREACHABLE} ] '
                  '|| rc=3; exit "$rc"; }')
        checks = f"{srun}{shell.quote(node_check)}{' <&3' if staged else ''} || {failed}\n"
    staged_end = ' <&4\nrc=$?\n[ "$rc" = 0 ] || clean_nodes\nexit "$rc"'
    export_lines = "\n".join(exports)
    header = "\n".join(f"#SBATCH {line}" for line in directives)
    return f"""#!/bin/bash
{header}
# One torchrun agent per node (srun, one task per node), static rendezvous at the first
# node's address. Written by jupyter-dlc: {spec.nodes} node(s) x {spec.nproc_per_node} process(es).
set -u
{preamble}{export_lines}
# Node names need not resolve: rendezvous at the head node's NodeAddr.
head="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"
addr="$(scontrol show node "$head" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p' | head -n1)"
export MASTER_ADDR="${{addr:-$head}}"
export MASTER_PORT={port}
{staged.lines(srun) if staged else f"mkdir -p {shell.word(log_dir, slots)}"}
# The batch step's task counts must not leak into srun's own request.
unset SLURM_NTASKS SLURM_NPROCS SLURM_NTASKS_PER_NODE
{checks}{srun}{shell.quote(task)}{staged_end if staged else ""}
"""


class SlurmEngine(Engine):
    submit_verb = "sbatch"
    name = "slurm"
    profile_options = {
        "partition": Option(str, "a partition name"), "account": Option(str, "an account name"),
        "qos": Option(str, "a QOS name"),
        # A bare number is minutes, as Slurm reads it.
        "time": Option(str, "a Slurm time limit like 1:00:00 or 60", number_as_text=True),
        "gres": Option(str, "a GRES string like gpu:8"), "constraint": Option(str, "a feature expression"),
        "sbatch_args": Option(list, "a list of strings"),
        "shared_filesystem": Option(bool, "true when the nodes see the launcher's job directory"),
        "checkpoint_dir": Option(str, "a directory every node and the launcher see, for checkpoints "
                                 "(one per job under it); needed without a shared filesystem")}

    def __init__(self):
        # job id -> (when asked, squeue's record or None when Slurm does not know it)
        self._seen: dict[str, tuple[float, dict | None]] = {}
        self._completing: dict[str, float] = {}  # job id -> when first seen COMPLETING, failing

    # -- what it can do, and whether it can run this at all -------------------------------
    def capabilities(self, spec: JobSpec) -> Capabilities:
        shared = bool(profile_of(spec).get("shared_filesystem", False))
        # A pool's agents take their orders from the pool directory: a shared filesystem.
        # Branches plant the parent's step in the checkpoint directory, which the launcher
        # sees either way (without a shared filesystem: the profile's checkpoint_dir).
        return Capabilities(standby_agents=False, warm_pools=shared, shared_filesystem=shared,
                            per_rank_signals=False, node_preflight=True, branches=True)

    def pool_driver(self, options: dict[str, Any] | None):
        # The agents take their orders from the pool directory, as ranks their job directory.
        if options is not None and not options.get("shared_filesystem"):
            return "a Slurm pool needs shared_filesystem: true in the profile; jobs start cold"
        return _pooled().SlurmPoolDriver()

    def capacity_error(self, spec: JobSpec) -> str | None:
        profile = profile_of(spec)
        try:  # what cannot go on an #SBATCH line is refused now, naming the field
            sbatch_directives(spec, profile, spec.name, "slurm-%j.out", spec.workdir)
        except shell.UnsafeValue as error:
            return str(error)
        if not profile.get("shared_filesystem"):
            problem = staging.checkpoint_dir_error(spec, profile, "nodes") or payload_error(spec, profile.name)
            if problem:
                return problem
        try:
            nodes = self._partition_nodes(profile)
        except RuntimeError as error:
            return f"cluster {profile.name}: {error}"
        if not nodes:
            return f"cluster {profile.name}: partition {profile.get('partition') or '(default)'} has no nodes"
        if spec.nodes > len(nodes):
            return (f"nodes: {spec.nodes} nodes but partition {profile.get('partition') or '(default)'} "
                    f"of cluster {profile.name} has {len(nodes)}; use --nodes {len(nodes)} or fewer")
        res = spec.resources
        for field_name, wanted, have, flag, unit in (
                ("resources.cpus", res.get("cpus") or spec.nproc_per_node, max(n["cpus"] for n in nodes),
                 "--cpus-per-node", ""),
                ("resources.gpus", res.get("gpus") or 0, max(n["gpus"] for n in nodes),
                 "--gpus-per-node", ""),
                ("resources.memory", res.get("memory_mb") or 0, max(n["memory_mb"] for n in nodes),
                 "--memory-per-node", "M")):
            if wanted > have:
                return (f"{field_name}: {wanted}{unit} per node but the largest node of cluster "
                        f"{profile.name} has {have}{unit}; use {flag} {have}{unit} or less")
        return None

    def checkpoint_dir(self, spec: JobSpec, job_id: str, job_dir: str) -> str:
        """The spec's, else the profile's `checkpoint_dir` (one directory per job under it:
        a path every node and the launcher see), else the job directory's."""
        return (staging.profile_checkpoint_dir(spec, profile_of(spec), job_id)
                or super().checkpoint_dir(spec, job_id, job_dir))

    def _partition_nodes(self, profile) -> list[dict[str, Any]]:
        """One row per node of the profile's partition: state, CPUs, GPUs, memory (MB)."""
        argv = ["sinfo", "-h", "-N", "-o", "%N|%t|%c|%m|%G"]
        if profile.get("partition"):
            argv += ["-p", profile.get("partition")]
        out = run_slurm(argv, client_env(profile), check=True).stdout
        rows = {}
        for line in out.splitlines():
            name, state, cpus, memory, gres = (line.split("|") + [""] * 5)[:5]
            gpus = 0
            for item in gres.split(","):
                parts = item.split("(")[0].split(":")
                if parts[0] == "gpu" and parts[-1].isdigit():
                    gpus += int(parts[-1])
            rows[name] = {"name": name, "state": state.rstrip("*~#!%$@^-"),
                          "cpus": int(cpus or 0), "memory_mb": int(memory or 0), "gpus": gpus}
        return list(rows.values())

    def check(self, profile) -> dict[str, Any]:
        try:
            nodes = self._partition_nodes(profile)
        except RuntimeError as error:
            return {"ok": False, "detail": str(error)}
        idle = sum(1 for n in nodes if n["state"] == "idle")
        return {"ok": bool(nodes), "idle_nodes": idle, "gpus": sum(n["gpus"] for n in nodes),
                "detail": f"{len(nodes)} node(s) in partition {profile.get('partition') or '(default)'}"}

    # -- submit ---------------------------------------------------------------------------
    def dry_run(self, ctx: AttemptContext) -> DryRun:
        profile = profile_of(ctx.spec)
        python = ctx.spec.python or profile.get("python") or sys.executable
        staged = None
        output, cwd = os.path.join(ctx.attempt_dir, "slurm-%j.out"), ctx.spec.workdir or ctx.job_dir
        workdir: str | None = cwd
        if not profile.get("shared_filesystem"):
            # The nodes cannot write the launcher's files nor start in its job directory:
            # the batch output is dropped (the nodes' logs come back through slurm_node) and
            # each node's task starts in its own copy of the job directory.
            staged = Staged(ctx.job_dir, cwd, slurm_node.encode_payload(staging.staged_files(ctx.job_dir)),
                            f"dlc-{ctx.job_id}-a{ctx.attempt}-n")
            if len(staged.payload) > SCRIPT_PAYLOAD_LIMIT:  # grown since submit's check
                raise SubmitError(payload_error(ctx.spec, profile.name) or "files: too large for a batch "
                                  "script", permanent=True)
            output, workdir = "/dev/null", ctx.spec.workdir
        directives = sbatch_directives(ctx.spec, profile, f"dlc-{ctx.job_id}-a{ctx.attempt}", output, workdir)
        exports = [shell.export(k, v) for k, v in job_script_env(ctx, profile).items()]
        script = render_sbatch(ctx.spec, directives, exports, python, ctx.script_path,
                               ctx.attempt_dir, str(ctx.port or 29500), preflight=True,
                               umask=children.CHILD_UMASK, staged=staged)
        # --export=ALL: the ranks get the launcher's PATH and such, and the token, which
        # stays out of the script file (submit adds it to sbatch's environment).
        return DryRun("slurm", cluster=profile.name, files={BATCH_SCRIPT: script}, labels=["submitted as"],
                      commands=[["sbatch", "--parsable", "--export=ALL",
                                 os.path.join(ctx.attempt_dir, BATCH_SCRIPT)]])

    def submit(self, ctx: AttemptContext, request: DryRun) -> dict[str, Any]:
        profile = profile_of(ctx.spec)
        os.makedirs(ctx.attempt_dir, exist_ok=True)
        path = request.commands[0][-1]
        with open(path, "w") as f:
            f.write(request.files[BATCH_SCRIPT])
        env = dict(client_env(profile), DLC_TOKEN=ctx.env["DLC_TOKEN"],
                   DLC_LAUNCHER_URL=ctx.env["DLC_LAUNCHER_URL"])
        out = sbatch(request.commands[0], env)
        job_id = out.strip().split(";")[0]
        return {"engine_id": job_id, "script": path, "submitted": time.time()}

    def adopt(self, ctx: AttemptContext) -> dict[str, Any] | None:
        """The Slurm job of the attempt, found by its name (a launcher killed between sbatch
        and storing the id): the first one submitted that Slurm still runs or queues is
        the attempt's, any other running under the name is cancelled; else the newest that
        ended (its outcome stands); None when Slurm has none of that name."""
        env = client_env(profile_of(ctx.spec))
        result = run_slurm(["squeue", "-h", "--states=all", f"--name={ctx.engine_name}", "-o", "%i|%T"], env)
        if result.returncode != 0:
            raise SubmitError(f"squeue: {(result.stderr or result.stdout).strip()}", permanent=False)
        jobs = sorted(((int(i), state) for i, _, state in
                       (line.partition("|") for line in result.stdout.split()) if i.isdigit()))
        active = [str(i) for i, state in jobs if state in ACTIVE]
        for duplicate in active[1:]:
            run_slurm(["scancel", duplicate], env)
        chosen = active[0] if active else (str(jobs[-1][0]) if jobs else None)
        if chosen is None:
            return None
        return {"engine_id": chosen, "script": os.path.join(ctx.attempt_dir, "job.sbatch"),
                "submitted": time.time(), "cancelled": active[1:]}

    # -- describe -------------------------------------------------------------------------
    def _slurm_state(self, ctx: AttemptContext, job_id: str, fresh: bool) -> dict | None:
        """squeue's record of the job, or the end state recorded before Slurm forgot it."""
        record_path = os.path.join(ctx.attempt_dir, "slurm-state.json")
        try:
            with open(record_path) as f:
                return json.load(f)  # ended: Slurm will not change its mind
        except (OSError, ValueError):
            pass
        asked, known = self._seen.get(job_id, (0.0, None))
        if fresh or time.monotonic() - asked >= POLL_INTERVAL:
            result = run_slurm(["squeue", "--json", f"--jobs={job_id}"], client_env(profile_of(ctx.spec)))
            jobs = json.loads(result.stdout).get("jobs", []) if result.returncode == 0 else []
            match = [j for j in jobs if str(j.get("job_id")) == job_id]
            self._cancel_duplicates(ctx, job_id, jobs)
            if result.returncode != 0 and "Invalid job id" not in result.stderr:
                return known or {"job_state": "RUNNING", "unreachable": result.stderr.strip()}
            known = {"job_state": match[0].get("job_state"), "reason": match[0].get("state_reason"),
                     "exit_code": match[0].get("exit_code"), "nodes": match[0].get("nodes")} \
                if match else {"job_state": "GONE"}
            self._seen[job_id] = (time.monotonic(), known)
        if known and known["job_state"] not in ACTIVE:
            layout.write_json_atomic(record_path, known)  # the launcher's own exit record
            self._seen.pop(job_id, None)
        return known

    def _cancel_duplicates(self, ctx: AttemptContext, job_id: str, jobs: list[dict]) -> None:
        """Another Slurm job of the attempt's name (a second submission a launcher made
        before it knew of the first) must not run beside the attempt's own: cancelled. Seen
        where squeue answers more than the job asked of (22.05's --json answers all)."""
        for job in jobs:
            other = str(job.get("job_id"))
            if job.get("name") == ctx.engine_name and other != job_id and job.get("job_state") in ACTIVE:
                run_slurm(["scancel", other], client_env(profile_of(ctx.spec)))

    def describe(self, ctx: AttemptContext, handle: dict[str, Any]) -> AttemptStatus:
        if handle.get("pool"):  # ran on a warm pool's agents (engines/slurm/pool.py)
            return _pooled().describe_job(ctx, handle)
        job_id = str(handle.get("engine_id") or "")
        status = AttemptStatus()
        exits = self._node_exits(ctx, job_id)
        records = rank_records(ctx)  # reported over the route: the ranks write no files
        failing = any(c not in (None, 0) for c in exits.values()) or \
            any(r.get("exit_code") not in (None, 0) for r in records.values())
        slurm = (self._slurm_state(ctx, job_id, fresh=failing) if job_id else None) or {"job_state": "GONE"}
        state = slurm["job_state"]
        # Right after a scancel, squeue says COMPLETING for a moment before CANCELLED; the
        # ranks it took down must not be judged as a failure of their own meanwhile.
        withhold = failing and state == "COMPLETING" and \
            time.monotonic() - self._completing.setdefault(job_id, time.monotonic()) < SETTLE
        if withhold:
            exits = dict.fromkeys(exits)
            records = {r: dict(rec, exit_code=None) for r, rec in records.items()}
        status.phase = Phase(ACTIVE.get(state, "ENDED"))
        status.alive = status.phase != "ENDED"
        unfit = failed_preflight(ctx.reported)
        if not unfit and status.phase == "ENDED" and _batch_exit(slurm) == layout.PREFLIGHT_UNREACHABLE:
            unfit = unreachable_launcher(f"a node of Slurm job {job_id}", ctx)
        if unfit:
            status.reason = unfit  # the launcher's word on a node, no retry: fix and resume
        elif status.phase == "PENDING":
            status.reason = slurm.get("reason") if slurm.get("reason") not in (None, "None") else state
        elif state in ENGINE_ENDS:
            status.reason = f"Slurm job {job_id} {ENGINE_ENDS[state]}"
        summary = {} if withhold else agent_summary_codes(ctx.attempt_dir, ctx.spec.nodes)
        for node, code in exits.items():
            status.nodes.append(NodeStatus(node, status.phase == "RUNNING" and code is None, code))
        for rank, record in records.items():
            code = record.get("exit_code")
            if code is None:
                code = summary.get(rank)
            if code is None and exits[rank // ctx.spec.nproc_per_node] == 0:
                code = 0  # left with os._exit before its record; the agent saw it exit 0
            pid = record.get("pid")
            running = code is None and pid is not None and status.phase == "RUNNING"
            status.ranks[rank] = RankStatus(rank, pid, running, code, record.get("start"),
                                            record.get("end"))
        return status

    def _node_exits(self, ctx: AttemptContext, job_id: str) -> dict[int, int | None]:
        """Each node's exit code as its task recorded it: the `node-K.exit` file where the
        nodes share the attempt directory, else the `node_exit` it reported (slurm_node)."""
        if self.capabilities(ctx.spec).shared_filesystem:
            return {n: read_owned_exit(layout.node_exit(ctx.attempt_dir, n), job_id) for n in range(ctx.spec.nodes)}
        return reported_exits(ctx.reported, ctx.spec.nodes, job_id)

    # -- stop, kill, cleanup --------------------------------------------------------------
    def stop(self, ctx: AttemptContext, handle: dict[str, Any], grace: float) -> None:
        """SIGTERM to every process of the job's steps; the supervisor kills after `grace`.
        Not `--full`: the batch shell must outlive its step, or Slurm would end the
        allocation and cut the ranks' grace to its own KillWait."""
        if handle.get("pool"):
            _pooled().order_job(ctx, "TERM")
            return
        job_id = handle.get("engine_id")
        if not job_id:
            return
        env = client_env(profile_of(ctx.spec))
        state = (self._slurm_state(ctx, str(job_id), fresh=True) or {}).get("job_state")
        self._seen.pop(str(job_id), None)
        if ACTIVE.get(state or "") == "RUNNING":
            run_slurm(["scancel", "--signal=TERM", str(job_id)], env)
        elif state in ACTIVE:
            # Pending: nothing runs to be signalled (scancel --signal would retry for minutes).
            run_slurm(["scancel", str(job_id)], env)

    def kill(self, ctx: AttemptContext, handle: dict[str, Any]) -> None:
        if handle.get("pool"):
            _pooled().order_job(ctx, "KILL")
            return
        job_id = handle.get("engine_id")
        if not job_id:
            return
        env = client_env(profile_of(ctx.spec))
        self._seen.pop(str(job_id), None)
        if not self.capabilities(ctx.spec).shared_filesystem:
            # The steps alone, with slurm_node's KILL_SIGNAL: each node's task kills the rest
            # of its node with SIGKILL and lives on to send its last log lines and its exit;
            # the batch shell (not signalled) removes the nodes' copies of the job directory
            # (clean_nodes) and ends the job within a second or two. Whatever is left after
            # CLEANUP_WAIT is cancelled below.
            run_slurm(["scancel", f"--signal={slurm_node.KILL_SIGNAL.name.removeprefix('SIG')}", str(job_id)], env)
            deadline = time.monotonic() + CLEANUP_WAIT
            while time.monotonic() < deadline and \
                    (self._slurm_state(ctx, str(job_id), fresh=True) or {}).get("job_state") in ACTIVE:
                time.sleep(POLL_INTERVAL / 2)  # a second or two: a few squeue calls, not a stream
            self._seen.pop(str(job_id), None)
        else:
            run_slurm(["scancel", "--full", "--signal=KILL", str(job_id)], env)
        run_slurm(["scancel", str(job_id)], env)

    def cleanup(self, ctx: AttemptContext, handle: dict[str, Any]) -> None:
        if handle.get("engine_id") and self.describe(ctx, handle).alive:
            self.kill(ctx, handle)
        remove_preflight_markers(ctx)

    # -- an exported bundle ------------------------------------------------------------------
    def export_files(self, spec: JobSpec, script: str, files: dict[str, str], job_id: str,
                     exports: list[str]) -> dict[str, str]:
        """`job.sbatch` of an exported bundle, whichever engine ran the job: `sbatch job.sbatch`
        from the bundle's directory runs it with plain torchrun on a Slurm cluster. Options come
        from the job's Slurm profile when it has one here; else edit the #SBATCH lines.
        `exports` are the bundle's environment lines (export.bundle_env), "$HERE" the bundle."""
        profile = profile_of(spec, lenient=True)
        directives = sbatch_directives(spec, profile, spec.name, "slurm-%j.out", None)
        python = spec.python or profile.get("python") or "python3"
        preamble = "\n".join([
            "# Submit from the bundle directory: cd <bundle> && sbatch job.sbatch",
            'export HERE="${SLURM_SUBMIT_DIR:-$(pwd)}"',
            "# PYTHON=... sbatch job.sbatch runs another Python.",
            shell.export_default("PYTHON", python, empty_wins=False), ""])
        slots = {"HERE": '"$HERE"', "PYTHON": '"$PYTHON"'}
        return {BATCH_SCRIPT: render_sbatch(
            spec, directives, exports, shell.slot("PYTHON"), shell.slot("HERE") + "/script.py",
            shell.slot("HERE") + "/logs", '"${MASTER_PORT:-29500}"', slots=slots,
            preamble=preamble, bootstrap=False)}


def _pooled():
    """Jobs on a warm pool's agents are watched through the shared attempt directory and
    stopped by orders their node processes carry out (slurm_pool.py): the nodes may be other
    hosts, whose processes the launcher can neither see nor signal."""
    from . import pool

    return pool
