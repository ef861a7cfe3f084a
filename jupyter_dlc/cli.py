"""`jupyter-dlc`: the same jobs as `%%dlc`, from a shell (same spec, same client)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from . import formatting, paths
from .client import TERMINAL, LauncherClient, LauncherError
from .spec import JOB_OPTIONS, SpecError, spec_from_options


def follow_logs(client: LauncherClient, job_id: str, rank: int | None, tail: int | None,
                out=sys.stdout, poll: float = 0.5) -> dict:
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
            print(f"[rank {line['rank']}] {line['text']}" if rank is None else line["text"], file=out)
        out.flush()
        if job["state"] in TERMINAL:
            return job
        time.sleep(poll)


def print_logs(client: LauncherClient, job_id: str, rank: int | None, tail: int | None) -> None:
    for line in client.logs(job_id, rank=rank, tail=tail)["lines"]:
        print(f"[rank {line['rank']}] {line['text']}" if rank is None else line["text"])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jupyter-dlc", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a script as a torchrun job",
                         usage="jupyter-dlc run SCRIPT [SCRIPT_ARGS...] [options] [-- SCRIPT_ARGS...]")
    run.add_argument("script")
    for flags, kwargs in JOB_OPTIONS:
        run.add_argument(*flags, **kwargs)
    run.add_argument("--wait", action="store_true", help="follow the job; exit 0 only if it succeeded")
    sub.add_parser("list", help="every job the launcher knows")
    for name, help_text in (("status", "one job in detail"), ("stop", "stop a job (SIGTERM, grace, SIGKILL)"),
                            ("why", "why a job failed: the first error and what to do"),
                            ("checkpoints", "committed checkpoints of a job"),
                            ("clone", "a new job from the same spec"), ("delete", "delete an ended job")):
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument("job")
        if name == "status":
            cmd.add_argument("--json", action="store_true")
        if name == "stop":
            cmd.add_argument("--grace", type=float, default=None, help="seconds before SIGKILL")
    logs = sub.add_parser("logs", help="a job's logs")
    logs.add_argument("job")
    logs.add_argument("--rank", type=int, default=None)
    logs.add_argument("--tail", type=int, default=None)
    logs.add_argument("--follow", "-f", action="store_true")
    resume = sub.add_parser("resume", help="resume an ended job from a committed checkpoint")
    resume.add_argument("job")
    resume.add_argument("--step", type=int, default=None, help="default: the newest committed step")
    export = sub.add_parser("export", help="write a bundle that runs with plain torchrun")
    export.add_argument("job")
    export.add_argument("dir")
    sub.add_parser("clusters", help="cluster profiles, each with a live check (reachable, idle nodes, GPUs)")
    launcher = sub.add_parser("launcher", help="the launcher service")
    launcher.add_argument("action", choices=["start", "stop", "status", "manifest"])
    launcher.add_argument("--namespace", default="default", help="manifest: the namespace")
    launcher.add_argument("--image", default=None, help="manifest: an image with jupyter-dlc")
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
        return _dispatch(options, extra + tail_args)
    except (SpecError, LauncherError, ValueError) as error:
        print(f"jupyter-dlc: {error}", file=sys.stderr)
        return 2 if isinstance(error, (SpecError, ValueError)) or getattr(error, "status", 0) in (400, 404, 409) else 1
    except KeyboardInterrupt:
        return 130


def _dispatch(options, script_args: list[str]) -> int:
    command = options.command
    if command == "launcher" and options.action == "manifest":
        from .k8s_launcher import render

        print(render(options.namespace, **({"image": options.image} if options.image else {})), end="")
        return 0
    if command == "launcher":
        return _launcher(options.action)
    if command == "clusters":
        from .clusters import check_clusters, clusters_table

        rows = check_clusters()
        print(clusters_table(rows))
        return 0 if all(row["ok"] for row in rows) else 1
    client = LauncherClient.connect(start=command == "run")
    if command == "run":
        script = os.path.abspath(options.script)
        if not os.path.isfile(script):
            raise SpecError("script", f"{options.script} does not exist; give a path to a Python file")
        spec = spec_from_options(options, script=script, args=script_args,
                                 source={"kind": "cli", "path": script})
        job = client.submit(spec)
        print(job["id"], flush=True)
        if not options.wait:
            return 0
        job = follow_logs(client, job["id"], None, None, out=sys.stderr)
        print(formatting.status_line(job), file=sys.stderr)
        return 0 if job["state"] == "SUCCEEDED" else 1
    if command == "status" and options.json:
        print(json.dumps(client.job(options.job), indent=1))
    elif command == "clone":
        print(client.clone(options.job)["id"])
    elif command == "resume":
        print(formatting.status_line(client.resume(options.job, options.step)))
    else:
        run_text_command(client, options)
    return 0


def run_text_command(client: LauncherClient, options) -> None:
    """The job commands whose answer is text, the same for `jupyter-dlc X` and `%dlc X`."""
    command = options.command
    if command == "list":
        print(formatting.jobs_table(client.jobs()))
    elif command == "status":
        print(formatting.status_text(client.job(options.job)))
    elif command == "logs":
        if options.follow:
            follow_logs(client, options.job, options.rank, options.tail)
        else:
            print_logs(client, options.job, options.rank, options.tail)
    elif command == "stop":
        print(formatting.status_line(client.stop(options.job, getattr(options, "grace", None))))
    elif command == "delete":
        client.delete(options.job)
        print(f"deleted {options.job}")
    elif command == "checkpoints":
        print(formatting.checkpoints_table(client.checkpoints(options.job)))
    elif command == "why":
        print(formatting.diagnosis_text(client.diagnosis(options.job), client.job(options.job)))
    elif command == "export":
        from .export import export_job

        for path in export_job(client, options.job, options.dir):
            print(path)
    else:
        raise ValueError(f"command: unknown {command!r}")


def _launcher(action: str) -> int:
    client = LauncherClient.from_connection_file()
    running = client is not None and client.alive()
    if action == "status":
        if not running:
            print("launcher: not running")
            return 1
        health = client.request("GET", "/healthz")[1]
        print(f"launcher: running at {client.url} (pid {health['pid']}, data {paths.data_dir()})")
        return 0
    if action == "start":
        client = LauncherClient.connect(start=True)
        print(f"launcher: running at {client.url}")
        return 0
    if not running:
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


if __name__ == "__main__":
    sys.exit(main())
