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
COLUMNS = ("measure", "goal", "latest", "met", "date", "host at start, and at the end", "command")
# The CPU probe (cpu_probe): a fixed pure-Python loop timed PROBE_REPS times, a few ms apart.
PROBE_LOOP = 400_000  # about 25 ms on this project's 2-core machines at full speed
PROBE_REPS = 9
HEADER = ("| " + " | ".join(COLUMNS) + " |\n"
          + "| " + " | ".join("---" for _ in COLUMNS) + " |")


@dataclass(frozen=True)
class Probe:
    """A fixed pure-Python loop timed PROBE_REPS times: the median and the fastest, in ms."""

    median_ms: float
    fastest_ms: float

    def __str__(self) -> str:
        return f"{self.median_ms:.0f} ms (fastest {self.fastest_ms:.0f})"


def cpu_probe(reps: int = PROBE_REPS) -> Probe:
    """How fast this host runs one core of Python now: the same loop, timed `reps` times a
    few ms apart.

    The load average does not see what slows a shared VM. On 2026-12-06, idle at load 0.4,
    this loop took 25 ms or 39 ms on either core, switching several times a second, and the
    same launcher code gave an ingest p99 of 200 ms in one run and 1.1 s in the next. A row
    measured at a median of 39 ms was measured on a slower machine than one at 25 ms; a
    median far above the fastest says the speed changed during the probe itself."""
    timings = []
    for _ in range(reps):
        start = time.perf_counter()
        total = 0
        for i in range(PROBE_LOOP):
            total += i * i
        timings.append((time.perf_counter() - start) * 1000)
        time.sleep(0.03)  # spread over a third of a second: the slow spells come and go
    timings.sort()
    return Probe(timings[len(timings) // 2], timings[0])


@dataclass(frozen=True)
class Host:
    """The machine as a benchmark starts: the 1-minute load average and the CPU probe."""

    load: float
    probe: Probe

    @classmethod
    def now(cls) -> "Host":
        return cls(os.getloadavg()[0], cpu_probe())

    def __str__(self) -> str:
        return f"load {self.load:.1f} on {os.cpu_count()} cores; CPU probe {self.probe}"


@dataclass(frozen=True)
class Row:
    measure: str
    goal: str
    latest: str
    met: str
    date: str
    host: str
    command: str

    def line(self) -> str:
        cells = (self.measure, self.goal, self.latest, self.met, self.date, self.host,
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
           host: Host, details: str = "", path: Path = RESULTS,
           history: Path = HISTORY, now: float | None = None, end_probe: Probe | None = None) -> Row:
    """Rewrite `measure`'s row (or add it) and append the run to the history. `host` as the
    run started; the CPU probe runs again here, at the end, unless `end_probe` gives it (a
    benchmark recording several rows at once probes once)."""
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(now))
    where = f"{host}; {cpu_probe() if end_probe is None else end_probe} at the end"
    row = Row(measure, goal, latest, "—" if met is None else ("met" if met else "missed"),
              stamp, where, command)
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
    entry = (f"\n## {measure} ({stamp}, {where})\n\n"
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
