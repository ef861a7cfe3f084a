"""`jupyter-dlc`: the same jobs as `%%dlc`, from a shell (same spec, same client)."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time

from . import formatting, paths, sweeps
from .client import TERMINAL, LauncherClient, LauncherError
from .commands import add_commands
from .spec import SpecError, spec_from_options

# ESC sequences (CSI, OSC up to BEL or ST, and two-byte ones) and every other control
# character but tab and newline: a job's output must not retitle, recolour or rewrite the
# user's terminal, nor hide lines from it.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -/]*[0-~]?|"
                      r"\x9b[0-?]*[ -/]*[@-~]|\x9d[^\x07\x9c]*[\x07\x9c]?")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def neutralise(text: str) -> str:
    """`text` safe to print: escape sequences dropped, other controls shown as \\xNN."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", _ESCAPES.sub("", text))


def _show_line(line: dict, rank: int | None, raw: bool) -> str:
    text = line["text"] if raw else neutralise(line["text"])
    return f"[rank {line['rank']}] {text}" if rank is None else text


def follow_logs(client: LauncherClient, job_id: str, rank: int | None, tail: int | None,
                out=sys.stdout, poll: float = 0.5, raw: bool = False) -> dict:
    """Print log lines as they come until the job ends; returns the final job."""
    cursor = None
    attempt = None
    while True:
        job = client.job(job_id)
        if attempt != job["attempt"]:
            if attempt is not None:
                print(f"--- attempt {job['attempt']} ---", file=out)
            attempt, cursor = job["attempt"], None
        answer = client.logs(job_id, rank=rank, tail=tail if cursor is None else None, cursor=cursor)
        cursor = answer["cursor"]
        for line in answer["lines"]:
            print(_show_line(line, rank, raw), file=out)
        out.flush()
        if job["state"] in TERMINAL:
            return job
        time.sleep(poll)


def print_logs(client: LauncherClient, job_id: str, rank: int | None, tail: int | None,
               raw: bool = False) -> None:
    for line in client.logs(job_id, rank=rank, tail=tail)["lines"]:
        print(_show_line(line, rank, raw))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jupyter-dlc", description=__doc__)
    add_commands(parser, "cli")
    return parser


def _split_script_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """Options we know go to us; the rest after SCRIPT (and all after `--`) go to the script."""
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return argv, []


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    mine, tail_args = _split_script_args(argv)
    parser = _parser()
    options, extra = parser.parse_known_args(mine)
    if extra and options.command != "run":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        code = _dispatch(options, extra + tail_args)
        sys.stdout.flush()  # here, where a closed pipe is still ours to handle
        return code
    except BrokenPipeError:
        # `jupyter-dlc status ... | head`: the reader has all it wanted. Leave quietly, and
        # keep the interpreter's own last flush from failing again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a process ended by SIGPIPE
    except (SpecError, LauncherError, ValueError) as error:
        print(f"jupyter-dlc: {error}", file=sys.stderr)
        return 2 if isinstance(error, (SpecError, ValueError)) or getattr(error, "status", 0) in (400, 404, 409) else 1
    except KeyboardInterrupt:
        return 130


def _dispatch(options, script_args: list[str]) -> int:
    command = options.command
    if command == "launcher" and options.action == "manifest":
        from .engines.kubernetes.launcher_manifests import render

        print(render(options.namespace, **({"image": options.image} if options.image else {})), end="")
        return 0
    if command == "launcher":
        return _launcher(options.action)
    if command == "clusters":
        from .clusters import clusters_table
        from .engines.contract import check_clusters

        rows = check_clusters()
        print(clusters_table(rows))
        return 0 if all(row["ok"] for row in rows) else 1
    client = LauncherClient.connect(start=command == "run" or getattr(options, "action", "") == "up")
    if command == "run":
        script = os.path.abspath(options.script)
        if not os.path.isfile(script):
            raise SpecError("script", f"{options.script} does not exist; give a path to a Python file")
        spec = spec_from_options(options, script=script, args=script_args,
                                 source={"kind": "cli", "path": script})
        trials = sweeps.from_options(options, spec)
        if options.dry_run:
            specs = trials or [spec]
            print(formatting.dry_run_text(client.submit(specs[0], dry_run=True), specs[1:]))
            return 0
        if trials:
            return _run_sweep(client, trials, options.wait)
        job = client.submit(spec)
        print(job["id"], flush=True)
        if not options.wait:
            return 0
        job = follow_logs(client, job["id"], None, None, out=sys.stderr)
        print(formatting.status_line(job), file=sys.stderr)
        return 0 if job["state"] == "SUCCEEDED" else 1
    if command == "clone":
        print(client.clone(options.job)["id"])
    elif command == "resume":
        print(formatting.status_line(client.resume(options.job, options.step)))
    elif command == "wait":
        job = client.wait(client.job(options.job)["id"])
        print(formatting.status_line(job))
        return 0 if job["state"] == "SUCCEEDED" else 1
    else:
        run_text_command(client, options)
    return 0


def _run_sweep(client: LauncherClient, trials: list, wait: bool) -> int:
    """Submit a sweep's trials; with --wait, wait for them all, print the table, and exit 1
    when a trial failed."""
    jobs = sweeps.submit(client, trials)
    sweep_id = trials[0].sweep["id"]
    print(f"sweep {sweep_id}: {len(jobs)} trials ({', '.join(j['id'] for j in jobs)})", flush=True)
    if not wait:
        return 0
    ended = [client.wait(job["id"]) for job in jobs]
    print(formatting.sweep_table(sweeps.trials_of(client, sweep_id)))
    # A trial stopped (an early-stop rule, a user's stop) is the sweep working; a failed one is not.
    return 1 if any(job["state"] == "FAILED" for job in ended) else 0


def run_text_command(client: LauncherClient, options) -> None:
    """The job commands whose answer is text, the same for `jupyter-dlc X` and `%dlc X`."""
    command = options.command
    if command == "list":
        print(formatting.jobs_table(client.jobs(), tree=options.tree))
    elif command == "status" and options.json:
        print(json.dumps(client.job(options.job), indent=1))
    elif command == "status":
        print(formatting.status_text(client.job(options.job), client.goodput(options.job)))
    elif command == "logs":
        if options.follow:
            follow_logs(client, options.job, options.rank, options.tail, raw=options.raw)
        else:
            print_logs(client, options.job, options.rank, options.tail, raw=options.raw)
    elif command == "stop":
        print(formatting.status_line(client.stop(options.job, options.grace)))
    elif command == "delete":
        client.delete(options.job)
        print(f"deleted {options.job}")
    elif command == "checkpoints":
        print(formatting.checkpoints_table(client.checkpoints(options.job)))
    elif command == "compare":
        from . import compare

        print(compare.render_text(compare.gather(client, options.jobs, options.metric), options.metric))
    elif command == "sweep":
        print(formatting.sweep_table(sweeps.trials_of(client, options.sweep, options.metric), options.metric))
    elif command == "why":
        answer = client.why(options.job)
        print(formatting.diagnosis_text(answer["diagnoses"], client.job(options.job), answer.get("verdict")))
    elif command == "evidence":
        print(formatting.evidence_text(client.evidence(options.job)))
    elif command == "pool":
        print(pool_command(client, options))
    elif command == "export":
        from .export import export_job

        for path in export_job(client, options.job, options.dir):
            print(path)
    else:
        raise ValueError(f"command: unknown {command!r}")


def pool_command(client: LauncherClient, options) -> str:
    """`pool up|down|status`: the pools after the change, or what was released."""
    if options.action == "up":
        if options.nodes is None or options.nproc_per_node is None:
            raise SpecError("nodes", "pool up needs the shape: --nodes N --nproc-per-node M")
        client.pool_up(options.nodes, options.nproc_per_node, options.cluster, options.idle_timeout)
    elif options.action == "down":
        released = client.pool_down(options.nodes, options.nproc_per_node, options.cluster)
        return "released " + (", ".join(released) if released else "nothing (no pool matched)")
    return formatting.pools_table(client.pools())


def _launcher(action: str) -> int:
    if action == "start":
        client = LauncherClient.connect(start=True)
        print(f"launcher: running at {client.url}")
        _print_warnings(client.request("GET", "/healthz")[1])
        return 0
    # Raises, in one line, when something else answers on the port or a launcher holds the
    # data dir without answering; None: no launcher at all.
    client = LauncherClient.find()
    if action == "status":
        if client is None:
            print("launcher: not running")
            return 1
        health = client.request("GET", "/healthz")[1]
        print(f"launcher: running at {client.url} (pid {health['pid']}, data {paths.data_dir()})")
        _print_warnings(health)
        return 0
    if client is None:
        print("launcher: not running")
        return 0
    pid = client.request("GET", "/healthz")[1]["pid"]
    os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        if not client.alive():
            break
        time.sleep(0.05)
    print("launcher: stopped (jobs keep running; the next launcher adopts them)")
    return 0


def _print_warnings(health: dict) -> None:
    """What the launcher found wrong at its start (a store that lost its jobs), one a line."""
    for warning in health.get("warnings") or ():
        print(f"launcher: WARNING: {warning}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
