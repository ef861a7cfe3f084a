"""benchmarks/RESULTS.md as a dashboard: one row a measure, rewritten in place by the
benchmark that measured it; every run's full output appended to benchmarks/HISTORY.md.

A benchmark calls `record(...)` once a measure is known (after printing its ratio last).
The row is found by its measure's name (the table's first column), so the same benchmark
run twice leaves one row with the newest figure, and the history keeps both. The table sits
between two marker comments; what is outside them (the notes) is never touched.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
# DLC_BENCH_RESULTS_DIR: another folder holding both files (a test runs a benchmark for real
# against copies, leaving the project's own dashboard alone).
_DIR = Path(os.environ.get("DLC_BENCH_RESULTS_DIR") or HERE)
RESULTS = _DIR / "RESULTS.md"
HISTORY = _DIR / "HISTORY.md"
BEGIN = "<!-- dashboard: rows rewritten by benchmarks/results.py -->"
END = "<!-- /dashboard -->"
COLUMNS = ("measure", "goal", "latest", "met", "date", "load at start", "command")
HEADER = ("| " + " | ".join(COLUMNS) + " |\n"
          + "| " + " | ".join("---" for _ in COLUMNS) + " |")


@dataclass(frozen=True)
class Row:
    measure: str
    goal: str
    latest: str
    met: str
    date: str
    load: str
    command: str

    def line(self) -> str:
        cells = (self.measure, self.goal, self.latest, self.met, self.date, self.load,
                 f"`{self.command}`" if self.command and not self.command.startswith("`")
                 else self.command)
        return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _cell(text: str) -> str:
    # A pipe or a newline inside a cell would break the table's row.
    return " ".join(str(text).replace("|", "\\|").split())


def _split(line: str) -> list[str]:
    """A row's cells as written before `_cell` escaped them (`\\|` reads back as `|`)."""
    cells, cur = [], ""
    for ch in line.strip().removeprefix("|").removesuffix("|"):
        if ch == "|" and cur.endswith("\\"):
            cur = cur[:-1] + ch
        elif ch == "|":
            cells.append(cur.strip())
            cur = ""
        else:
            cur += ch
    cells.append(cur.strip())
    return cells


def rows(path: Path = RESULTS) -> list[Row]:
    """The dashboard's rows as stored."""
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{path}: no dashboard table between {BEGIN!r} and {END!r}")
    body = text.split(BEGIN, 1)[1].split(END, 1)[0]
    out = []
    for line in body.strip().splitlines()[2:]:  # past the header and its rule
        cells = _split(line)
        if len(cells) != len(COLUMNS):
            raise ValueError(f"{path}: a dashboard row has {len(cells)} cells, not "
                             f"{len(COLUMNS)}: {line!r}")
        out.append(Row(*cells))
    return out


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def record(measure: str, goal: str, latest: str, met: bool | None, command: str,
           load: float, details: str = "", path: Path = RESULTS,
           history: Path = HISTORY, now: float | None = None) -> Row:
    """Rewrite `measure`'s row (or add it) and append the run to the history."""
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(now))
    row = Row(measure, goal, latest, "—" if met is None else ("met" if met else "missed"),
              stamp, f"{load:.1f} on {os.cpu_count()} cores", command)
    text = path.read_text()
    current = rows(path)
    names = [r.measure for r in current]
    if measure in names:
        current[names.index(measure)] = row
    else:
        current.append(row)
    table = "\n".join([HEADER] + [r.line() for r in current])
    head, rest = text.split(BEGIN, 1)
    _write_atomic(path, head + BEGIN + "\n" + table + "\n" + END + rest.split(END, 1)[1])
    entry = (f"\n## {measure} ({stamp}, load {load:.1f} on {os.cpu_count()} cores)\n\n"
             f"`{command}`: **{latest}** (goal {goal}: {row.met})\n")
    if details.strip():
        entry += "\n```\n" + details.strip("\n") + "\n```\n"
    with open(history, "a") as f:
        f.write(entry)
    return row


def add_argument(parser) -> None:
    """`--no-record`, the same flag on every benchmark (a trial run leaves no row)."""
    parser.add_argument("--no-record", "--no-append", dest="no_record", action="store_true",
                        help="do not update benchmarks/RESULTS.md and HISTORY.md")


def command_line(argv: list[str]) -> str:
    """The command that reproduces this run, as the dashboard shows it."""
    script = os.path.relpath(os.path.abspath(argv[0]), HERE.parent)
    return " ".join(["python", script] + argv[1:])
