"""Plain-text renderings of launcher answers, shared by the CLI and the line magics."""

from __future__ import annotations

import os
import time


def age(t: float | None, now: float | None = None) -> str:
    if not t:
        return "-"
    s = max(0, int((now or time.time()) - t))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600}h"


def elapsed(job: dict, now: float | None = None) -> str:
    start = job.get("started") or job.get("created")
    end = job.get("ended") or now or time.time()
    return age(start, end) if start else "-"


def _loss(value) -> str:
    if value is None:
        return "-"
    try:
        return f"{float(value):.4g}"
    except (TypeError, ValueError):
        return str(value)


def jobs_table(jobs: list[dict], tree: bool = False) -> str:
    """The job list; `tree`: each branch under its parent, indented, with the step it left from."""
    if not jobs:
        return "no jobs"
    header = ("ID", "STATE", "ATTEMPT", "NODESxPROCS", "STEP", "LOSS", "GOODPUT", "AGE")
    placed = lineage(jobs) if tree else [(j, 0) for j in jobs]
    rows = [header] + [
        (_tree_id(j, depth) if tree else j["id"], j["state"], str(j["attempt"]),
         f"{j['nodes']}x{j['nproc_per_node']}", step_cell(j), _loss(j.get("last_loss")),
         percent(j.get("goodput")), age(j.get("created")))
        for j, depth in placed
    ]
    return table(rows)


def lineage(jobs: list[dict]) -> list[tuple[dict, int]]:
    """(job, depth) in tree order: each job followed by its branches (oldest first), a branch
    whose parent is not listed (deleted) at the top. What `list --tree` and the panel draw."""
    ids = {j["id"] for j in jobs}
    children: dict[str | None, list[dict]] = {}
    for job in sorted(jobs, key=lambda j: (j.get("created") or 0, j["id"])):
        parent = (job.get("parent") or {}).get("job")
        children.setdefault(parent if parent in ids else None, []).append(job)
    out: list[tuple[dict, int]] = []
    stack = [(job, 0) for job in reversed(children.get(None, []))]
    while stack:
        job, depth = stack.pop()
        out.append((job, depth))
        stack.extend((child, depth + 1) for child in reversed(children.get(job["id"], [])))
    return out


def _tree_id(job: dict, depth: int) -> str:
    parent = job.get("parent")
    if not parent:
        return job["id"]
    return "  " * (depth - 1) + ("└─ " if depth else "") + f"{job['id']} @{parent['step']}" + (
        "" if depth else f" (from {parent['job']}, deleted)")


def step_cell(job: dict) -> str:
    step, total = job.get("last_step"), (job.get("progress") or {}).get("total_steps")
    if step is None:
        return "-" if total is None else f"0/{total}"
    return f"{step}/{total}" if total else str(step)


def percent(ratio: float | None) -> str:
    """A goodput ratio as the views show it: "83%" (one decimal under 10%), "-" when none."""
    if ratio is None:
        return "-"
    value = 100 * ratio
    return f"{value:.1f}%" if value < 10 else f"{value:.0f}%"


def progress_line(progress: dict | None) -> str:
    """"step 256 / 400, ETA 7 s": what the view's header, the lists and `status` show of a
    job's progress ("" when it has none). The ETA is the launcher's (launcher/goodput.py)."""
    if not progress or progress.get("step") is None and progress.get("total_steps") is None:
        return ""
    step = progress.get("step")
    text = f"step {step if step is not None else 0}"
    if progress.get("total_steps"):
        text += f" / {progress['total_steps']}"
        if progress.get("eta_seconds") is not None:
            text += f", ETA {duration(progress['eta_seconds'])}"
    return text


def duration(seconds: float) -> str:
    """7 s, 3 min 20 s, 2 h 5 min."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


# The ledger's parts as people read them, in the order the bar stacks them.
GOODPUT_PARTS = (("productive", "productive"), ("data_wait", "data wait"),
                 ("checkpoint_stall", "checkpoint stall"), ("startup", "start-up"),
                 ("waiting", "waiting"), ("lost_work", "lost work"),
                 ("restart_downtime", "restart downtime"), ("hung", "hung"),
                 ("stopped", "stopped"), ("shutdown", "shutdown"))


def goodput_line(ledger: dict | None) -> str:
    """"goodput 83% of 1 min 2 s: productive 52 s, data wait 4 s, ..." (parts of 0 left out)."""
    if not ledger:
        return ""
    parts = ", ".join(f"{label} {duration(ledger['parts'][key])}" for key, label in GOODPUT_PARTS
                      if ledger["parts"].get(key, 0) >= 0.5)
    return f"goodput {percent(ledger.get('goodput'))} of {duration(ledger['wall_seconds'])}" + (
        f": {parts}" if parts else "")


def table(rows: list[tuple[str, ...]]) -> str:
    """Rows of text cells in aligned columns (the first row is the header)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip() for row in rows)


def status_line(job: dict) -> str:
    ranks = job.get("ranks") or []
    counts: dict[str, int] = {}
    for rank in ranks:
        counts[rank["state"]] = counts.get(rank["state"], 0) + 1
    rank_text = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "-"
    step = job.get("last_step")
    parts = [f"{job['id']}: {job['state']}", f"attempt {job['attempt']}", f"ranks: {rank_text}",
             f"elapsed {elapsed(job)}"]
    if step is not None:
        progress = progress_line(job.get("progress")) or f"step {step}"
        parts.append(f"{progress}, loss {_loss(job.get('last_loss'))}")
    text = " | ".join(parts)
    if job["state"] in ("FAILED", "STOPPED", "RESTARTING", "PENDING") and job.get("reason"):
        text += f"\n  reason: {job['reason']}"
    return text


def engine_text(job: dict) -> str | None:
    """Where the job runs, e.g. `slurm job 12 on cluster local-slurm`; None for local jobs."""
    spec = job.get("spec") or {}
    engine = spec.get("engine") or spec.get("backend") or "local"
    if engine == "local" and not spec.get("cluster"):
        return None
    attempts = job.get("attempts") or []
    engine_id = attempts[-1].get("engine_id") if attempts else None
    text = f"{engine} job {engine_id}" if engine_id else engine
    return text + (f" on cluster {spec['cluster']}" if spec.get("cluster") else "")


def engine_limits_text(job: dict) -> str | None:
    """What the job's engine cannot do for it (the detail's `engine_report`, contract.capability_report),
    as the panel's detail says it (labextension/src/engine.ts); None when nothing is missing."""
    report = job.get("engine_report") or {}
    if report.get("error"):
        return f"{report.get('name')}: {report['error']}"
    missing = [item.get("feature", "") for item in report.get("cannot") or []]
    return f"not on {report.get('name')} for this job: {'; '.join(missing)}" if missing else None


def status_text(job: dict, ledger: dict | None = None) -> str:
    lines = [status_line(job), f"  dir: {job.get('job_dir')}"]
    if job.get("parent"):
        lines.append(f"  branched from: {job['parent']['job']} at step {job['parent']['step']}")
    if ledger:
        lines.append(f"  {goodput_line(ledger)}")
    if engine_text(job):
        lines.append(f"  engine: {engine_text(job)}")
    if engine_limits_text(job):
        lines.append(f"  {engine_limits_text(job)}")
    start = (job.get("attempts") or [{}])[-1].get("start")
    if start:
        lines.append(f"  start: {start}")
    header = ("RANK", "NODE", "STATE", "STEP", "HEARTBEAT", "EXIT", "PID")
    rows = [header] + [
        (str(r["rank"]), str(r["node"]), r["state"], "-" if r["last_step"] is None else str(r["last_step"]),
         age(r["last_heartbeat"]) + (" ago" if r["last_heartbeat"] else ""),
         "-" if r["exit_code"] is None else str(r["exit_code"]), str(r["pid"] or "-"))
        for r in job.get("ranks") or []
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip() for row in rows]
    if job.get("last_checkpoint"):
        ckpt = job["last_checkpoint"]
        lines.append(f"  last checkpoint: step {ckpt['step']} ({age(ckpt.get('time'))} ago)")
    return "\n".join(lines)


def checkpoints_table(checkpoints: list[dict]) -> str:
    if not checkpoints:
        return "no committed checkpoints"
    rows = [("STEP", "TIME", "SIZE", "WORLD", "SHA256", "PATH")] + [
        (str(c["step"]), time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c["time"] or 0)),
         f"{(c.get('size') or 0) / 2**20:.1f} MB", str(c.get("world_size") or "-"),
         _verification(c), c["path"])
        for c in checkpoints
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip() for row in rows)


def _verification(checkpoint: dict) -> str:
    """The SHA256 column: what restoring the step found of its files (launcher/checkpoints.py)."""
    state = checkpoint.get("verification") or "unverified"
    if state != "corrupt":
        return state
    names = sorted({os.path.basename(f.get("file") or "?") for f in checkpoint.get("corrupt") or []})
    return f"CORRUPT ({', '.join(names)})"


def number_ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 5] -> "1-3, 5"."""
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def verdict_text(job: dict, verdict: dict | None) -> str:
    """The performance verdict of a job that did not fail (launcher/performance.py)."""
    if verdict is None:
        return (f"{job['id']} is {job['state']}: no failed attempt to explain, and no step "
                "breakdown (step_ms, data_wait_ms, grad_sync_ms) logged to judge its speed")
    return "\n".join([f"{job['id']} is {job['state']}: {verdict['verdict']}",
                      f"  {verdict['line']}", f"  what to do: {verdict['suggestion']}"])


def evidence_text(folders: list[dict]) -> str:
    """`jupyter-dlc evidence JOB`: each attempt's evidence folder and what it holds."""
    if not folders:
        return "no evidence kept: no attempt of this job was killed hung or failing"
    out = []
    for folder in folders:
        out.append(f"attempt {folder['attempt']}: {folder['dir']} ({folder['reason']}; "
                   f"kept in {folder['seconds']:.1f}s)")
        out += [f"  {f['name']:<28} {f['size']:>9} B  {f['what']}" for f in folder["files"]]
        out += [f"  not kept: {why}" for why in folder.get("skipped", [])]
    return "\n".join(out)


def diagnosis_text(diagnoses: list[dict], job: dict, verdict: dict | None = None) -> str:
    """Each distinct first error in full once; repeats (other attempts, other ranks) grouped
    in one line each; for a job that did not fail, the performance verdict."""
    if not diagnoses:
        if job["state"] == "FAILED":
            return f"{job['id']} FAILED: {job.get('reason')}"
        return verdict_text(job, verdict)
    out: list[str] = []
    shown: dict[tuple, list[int]] = {}  # error -> attempts with it, the first shown in full
    for d in diagnoses:
        key = (d.get("class"), d.get("line") or d.get("reason"), d.get("where"))
        if key in shown:
            shown[key].append(d["attempt"])
            continue
        shown[key] = [d["attempt"]]
        where = f"rank {d.get('rank')} on node {d.get('node')}" if d.get("rank") is not None else "job"
        out.append(f"attempt {d['attempt']}: {d.get('class')} ({where}): {d.get('line') or d.get('reason')}")
        out.append(f"@{len(shown) - 1}")  # where the repeats line goes, filled in below
        if d.get("same_ranks"):
            out.append(f"  ranks {number_ranges(d['same_ranks'])}: the same error")
        if d.get("where"):
            out.append(f"  at: {d['where']}")
        if d.get("suggestion"):
            out.append(f"  what to do: {d['suggestion']}")
        context = d.get("context") or []
        if context:
            out.append("  before it:")
            out += [f"    {line}" for line in context]
    repeats = [attempts[1:] for attempts in shown.values()]
    text = []
    for line in out:
        if line.startswith("@"):
            again = repeats[int(line[1:])]
            if again:
                word = "attempt" if len(again) == 1 else "attempts"
                text.append(f"  {word} {number_ranges(again)}: the same error again")
            continue
        text.append(line)
    if job["state"] != "FAILED" and verdict is not None:  # restarted, and running or done since
        text.append(verdict_text(job, verdict))
    return "\n".join(text)


def pools_table(pools: list[dict]) -> str:
    """Warm pools: shape, state, what they served and hold (node-hours so far)."""
    if not pools:
        return "no warm pools (start one: pool up --nodes N --nproc-per-node M)"
    rows = [("POOL", "STATE", "JOB", "SERVED", "IDLE", "RELEASED AFTER", "NODE-HOURS", "HOLDS")]
    for p in pools:
        holds = f"{p['engine']} job {p['engine_id']}" if p.get("engine_id") else "agents on this machine"
        rows.append((p["id"], p["state"], p["job"] or "-", str(p["jobs_served"]),
                     f"{p['idle_seconds']:.0f}s", f"{p['idle_timeout']:.0f}s idle",
                     f"{p['node_hours']:.3f}", holds))
    return table(rows)


def downsampled_note(thinned: dict | None) -> str:
    """What a view says under its charts once retention thinned older points (the metrics
    answer's `downsampled`); empty while every point is as logged."""
    if not thinned or not thinned.get("until"):
        return ""
    until = time.strftime("%H:%M:%S", time.localtime(thinned["until"]))
    bucket = thinned.get("bucket_seconds") or 0
    return (f"Points logged before {until} are downsampled (min, max and last of every "
            f"{bucket:g} s, NaN kept) to keep this job's storage bounded; "
            f"{thinned.get('dropped', 0):,} points thinned so far.")


def sweep_table(trials: list[dict], metric: str = "loss") -> str:
    """A sweep's trials (sweeps.trials_of): state, each parameter, step, last and best `metric`."""
    if not trials:
        return "no trials"
    names = list(dict.fromkeys(name for t in trials for name in (t.get("params") or {})))
    header = ("TRIAL", "JOB", "STATE", *(n.upper() for n in names), "STEP", f"LAST {metric.upper()}",
              f"BEST {metric.upper()}")
    best = min((t["best"] for t in trials if t.get("best") is not None), default=None)
    rows = [header] + [
        (str(t["sweep"]["trial"]), t["id"], t["state"], *(param_text(t["params"].get(n)) for n in names),
         step_cell(t), _loss(t.get("last")), _loss(t.get("best")) + (" *" if t.get("best") == best else ""))
        for t in trials]
    return table(rows)


def param_text(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def dry_run_text(answer: dict, more: list | None = None) -> str:
    """`--dry-run`'s answer (the launcher's DryRun) as a person reads an engine's request:
    command lines as a shell would take them, the batch script and manifests as files, the
    environment the launcher adds as `K=V` lines. Keys an engine adds later are shown as JSON.
    `more`: a sweep's other trials (specs), listed by their values."""
    import json
    import shlex

    request = dict(answer.get("request") or {})
    engine = answer.get("engine") or request.get("engine") or "?"
    out = [f"# --dry-run: what the {engine} engine would be asked for job {answer.get('job_id')}, "
           "attempt 1; nothing was submitted"]
    if request.get("cluster"):
        out.append(f"# cluster profile: {request['cluster']}")
    hosts, labels = request.get("hosts") or [], request.get("labels") or []
    for i, argv in enumerate(request.get("commands") or []):
        label = labels[i] if i < len(labels) else f"node on {hosts[i]}" if i < len(hosts) else f"node {i}"
        out += [f"# {label}:", shlex.join(argv)]
    for name, text in (request.get("files") or {}).items():
        out += [f"# {name}:", text.rstrip("\n")]
    if request.get("cwd"):
        out.append(f"# working directory: {request['cwd']}")
    if request.get("env"):
        out.append("# environment the launcher adds:")
        out += [f"{k}={shlex.quote(str(v))}" for k, v in sorted(request["env"].items())]
    native = {k: v for k, v in (request.get("native") or {}).items() if k != "manifests"}
    for key, value in native.items():  # the manifests are the files above, as YAML
        out += [f"# {key}:", json.dumps(value, indent=1, sort_keys=True)]
    if more:
        out.append(f"# and {len(more)} more trial(s) like it: " +
                   "; ".join(", ".join(f"{k}={v}" for k, v in spec.params.items()) for spec in more))
    return "\n".join(out)
