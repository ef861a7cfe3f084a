"""Where a line of the job's script.py came from, in the user's terms.

The ranks run `jobs/<id>/script.py`, our copy. A CLI job's copy is the user's file line for
line (`source.path` in spec.json, else the `script` path it was submitted with); a `%%dlc`
job's script is captured code plus the cell, and `source.lines` maps its lines back to
notebook cells (magics/capture.py, Capture.source_map). Lines capture added (comments, the
push loader) map to nothing. Stdlib only.
"""

from __future__ import annotations

import json
import os
import re
from bisect import bisect_right

_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


class SourceOrigin:
    def __init__(self, job_dir: str, source: dict | None):
        self.job_dir = os.path.abspath(job_dir)
        self.script = os.path.join(self.job_dir, "script.py")
        source = source if isinstance(source, dict) else {}
        self.kind = source.get("kind")
        self.path = source.get("path") if isinstance(source.get("path"), str) else None
        lines = source.get("lines")
        runs = lines if isinstance(lines, list) else []
        self.runs = sorted(tuple(r) for r in runs
                           if isinstance(r, list) and len(r) == 4 and all(isinstance(x, int) for x in r))

    def is_script(self, path: str) -> bool:
        """The job's copy, here or staged under the same job id on another node, or in the
        directory of its own that an SSH host without a shared filesystem writes it to
        (`dlc-<job>-a<N>-n<K>-*`, node/ssh_node.py), or a Kubernetes pod's ConfigMap
        mount (`/dlc/job`, k8s_manifests.JOB_DIR)."""
        job = os.path.basename(self.job_dir)
        if path == self.script or path.endswith((os.sep + os.path.join(job, "script.py"), "/dlc/job/script.py")):
            return True
        folder, name = os.path.split(path)
        return name == "script.py" and re.fullmatch(
            rf"dlc-{re.escape(job)}-a\d+-n\d+-[^/]+", os.path.basename(folder)) is not None

    def cell_line(self, line: int) -> tuple[int, int] | None:
        """(cell, line in the cell) of a notebook job's script line; None for added lines."""
        i = bisect_right([r[0] for r in self.runs], line) - 1
        if i < 0:
            return None
        start, cell, cell_start, count = self.runs[i]
        return (cell, cell_start + line - start) if line < start + count else None

    def place(self, path: str, line: int) -> str:
        """`path:line` in the user's terms."""
        if not self.is_script(path):
            return f"{path}:{line}"
        if self.kind == "cli" and self.path:
            return f"{self.path}:{line}"
        if self.kind == "notebook":
            found = self.cell_line(line)
            notebook = self.path or "the notebook"
            if found:
                return f"{notebook}, cell In[{found[0]}], line {found[1]}"
            return f"{path}:{line} (a line jupyter-dlc added, not in any cell)"
        return f"{path}:{line}"

    def relocate(self, text: str) -> str:
        """A traceback line with our copy's path replaced by the user's file or cell."""
        def swap(match: re.Match) -> str:
            path, line = match.group(1), int(match.group(2))
            if not self.is_script(path):
                return match.group(0)
            if self.kind == "cli" and self.path:
                return f'File "{self.path}", line {line}'
            found = self.cell_line(line) if self.kind == "notebook" else None
            return f"Cell In[{found[0]}], line {found[1]}" if found else match.group(0)
        return _FRAME.sub(swap, text)


def source_origin(job_dir: str) -> SourceOrigin:
    """The origin recorded in the job's spec.json (an empty one when there is none)."""
    try:
        with open(os.path.join(job_dir, "spec.json")) as f:
            spec = json.load(f)
        source = spec.get("source")
        if not source and isinstance(spec.get("script"), str):
            # Submitted by path through the API (client.submit, a scheduler's hook): the
            # copy is that file line for line, as a CLI job's is.
            source = {"kind": "cli", "path": spec["script"]}
    except (OSError, ValueError, AttributeError):
        source = None
    return SourceOrigin(job_dir, source)
