"""Alert rules: parse the small rule language, evaluate rules each supervisor tick, post webhooks.

Rules (one per line of `JobSpec.alerts`):

    METRIC OP VALUE [for DURATION]            gpu_util < 0.3 for 15m, checkpoint_seconds > 1800
    METRIC is nan                             loss is nan
    no progress for DURATION                  no progress for 15m
    METRIC OP Nx baseline K times             grad_sync_ms > 2x baseline 3 times
    straggler for DURATION                    straggler for 5m (launcher/stragglers.py)
    throughput OP Nx baseline for DURATION    throughput < 0.5x baseline for 5m
    METRIC OP Nx best for K steps             loss > 1.2x best for 200 steps (a sweep's trials)
    log matches /REGEX/[i]                    log matches /CUDA out of memory/
    ... -> notify | webhook URL | stop | checkpoint-and-stop

The evaluator is incremental: the launcher hands it a `JobSnapshot` of recent points each
tick; per series it remembers how far it has read, so a point that is still in the next
tick's window is not counted twice, and points a rank reports late are still seen. Episodes
(and everything a rule remembers) are in `state()`, so a restarted launcher neither
re-fires an alert that is already open nor forgets one.

`best` is the lowest value of METRIC that any trial of the job's sweep logged at the same
step (rank 0's values, as the sweep's table shows them, alerting.SweepBoard); a trial whose
value has stood OP N times that for K logged steps in a row meets the rule. With `-> stop` it
is successive halving without a scheduler of its own: a trial far behind the best at the
same step stops, and its slot goes to the next trial. Only a sweep's trials take the rule.

`log matches` rules run on RE2 (the `google-re2` package), never on Python's `re`: `re`
backtracks, and a rule like `/(a+)+$/` on a line of 30 `a` and a `!` held the launcher's
interpreter (its event loop, every job's supervision) for minutes. RE2 matches in time linear
in the line and refuses what it cannot do that way (backreferences, lookaround): such a rule
is refused at submit, naming it. Without the package, a `log matches` rule is refused at
submit too, rather than run on `re`.

Stdlib, `google-re2` and `jupyter_dlc.spec` only: the launcher imports this, nothing else should.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import statistics
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Iterable

from jupyter_dlc.spec import SpecError, format_duration, parse_duration

try:
    import re2
except ImportError:  # a broken install: `log matches` rules are then refused, not run on `re`
    re2 = None

ACTIONS = ("notify", "webhook", "stop", "checkpoint-and-stop")
OPS = {
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
}
# Baseline = median of a rank's first BASELINE_WINDOW values: the median ignores the slow
# warm-up steps that the first few collectives always have.
BASELINE_WINDOW = 10
# `throughput` is the job's steps per second over the last THROUGHPUT_WINDOW seconds (its
# highest step, as the ranks report it). Its baseline is the median of that rate over
# BASELINE_SPAN seconds of steady state, which starts BASELINE_SKIP seconds after the first
# step the launcher saw (start-up, first collectives and compilation are not steady state).
# A restart keeps the baseline; the rate is measured afresh within the new attempt.
# The launcher's DLC_THROUGHPUT_WINDOWS="WINDOW,SKIP,SPAN" (seconds) sets the three, for
# jobs whose steady state comes sooner or lasts less than four minutes.
THROUGHPUT_DEFAULTS = (30.0, 60.0, 180.0)


def throughput_windows(raw: str | None) -> tuple[float, float, float]:
    """DLC_THROUGHPUT_WINDOWS's three durations; SpecError naming it when it is not three
    positive numbers (the launcher says so at start and keeps the defaults)."""
    if not raw:
        return THROUGHPUT_DEFAULTS
    try:
        parts = tuple(float(x) for x in raw.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3 or not all(math.isfinite(x) and x > 0 for x in parts):
        raise SpecError("DLC_THROUGHPUT_WINDOWS", f"{raw!r} is not three positive numbers of "
                        "seconds; write WINDOW,SKIP,SPAN, e.g. 30,60,180")
    return parts[0], parts[1], parts[2]


try:
    THROUGHPUT_WINDOW, BASELINE_SKIP, BASELINE_SPAN = throughput_windows(os.environ.get("DLC_THROUGHPUT_WINDOWS"))
except SpecError as error:
    print(f"jupyter-dlc launcher: {error}; using {','.join(f'{x:g}' for x in THROUGHPUT_DEFAULTS)}",
          file=sys.stderr, flush=True)
    THROUGHPUT_WINDOW, BASELINE_SKIP, BASELINE_SPAN = THROUGHPUT_DEFAULTS
# A log-match episode ends after this long without another matching line; without it, a
# message printed every step would fire every tick.
LOG_QUIET_SECONDS = 300.0

DEFAULT_RULES = (
    # From the seeds: low GPU utilisation for 15 minutes is the early sign of a stuck data
    # loader or a failed distributed init. Only series that exist are evaluated, so a job
    # without GPU samples never fires it.
    "gpu_util < 0.3 for 15m",
    "loss is nan -> notify",
    # The training heartbeat (last completed step) catches hangs that leave GPUs busy.
    "no progress for 15m",
    "log matches /CUDA out of memory/",
    # Issue 23: a rank (or node) that keeps its peers waiting for five minutes is worth a word.
    "straggler for 5m -> notify",
)


@dataclass(frozen=True)
class Rule:
    text: str
    # "threshold" | "nan" | "no_progress" | "baseline" | "log" | "straggler" | "throughput" | "sweep_best"
    kind: str
    metric: str | None = None
    op: str | None = None
    value: float | None = None
    duration: float = 0.0
    factor: float | None = None
    times: int | None = None
    pattern: str | None = None
    ignore_case: bool = False
    action: str = "notify"
    url: str | None = None

    @property
    def condition(self) -> str:
        """Canonical condition text: the key for state, and for a user rule replacing a default."""
        if self.kind == "no_progress":
            return f"no progress for {format_duration(self.duration)}"
        if self.kind == "nan":
            return f"{self.metric} is nan"
        if self.kind == "log":
            pattern = (self.pattern or "").replace("/", "\\/")
            return f"log matches /{pattern}/{'i' if self.ignore_case else ''}"
        if self.kind == "straggler":
            return f"straggler for {format_duration(self.duration)}"
        if self.kind == "throughput":
            return f"throughput {self.op} {self.factor:g}x baseline for {format_duration(self.duration)}"
        if self.kind == "baseline":
            return f"{self.metric} {self.op} {self.factor:g}x baseline {self.times} times"
        if self.kind == "sweep_best":
            return f"{self.metric} {self.op} {self.factor:g}x best for {self.times} steps"
        tail = f" for {format_duration(self.duration)}" if self.duration else ""
        return f"{self.metric} {self.op} {self.value:g}{tail}"

    @property
    def key(self) -> str:
        action = f"webhook {self.url}" if self.action == "webhook" else self.action
        return f"{self.condition} -> {action}"

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.key, "condition": self.condition, "action": self.action, "url": self.url}


# ---------------------------------------------------------------------------------------
# Parser: a cursor over the text, so every error can name its 1-based column.

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]*")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_DURATION_TOKEN = re.compile(r"\d+(?:\.\d+)?(?:ms|s|m|h|d)?\b")
_OP = re.compile(r"<=|>=|==|!=|<|>")
_FACTOR = re.compile(r"(\d+(?:\.\d+)?)\s*x\b")
_INT = re.compile(r"\d+\b")


class _Cursor:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def fail(self, expected: str, at: int | None = None) -> SpecError:
        column = (self.pos if at is None else at) + 1
        found = self.text[self.pos:self.pos + 12] if at is None else ""
        got = f", got {found!r}" if found else (", got the end of the rule" if at is None else "")
        return SpecError("alerts", f"{self.text!r} at position {column}: expected {expected}{got}")

    def peek(self, pattern: re.Pattern | str) -> re.Match | None:
        self.skip_space()
        if isinstance(pattern, str):
            pattern = re.compile(re.escape(pattern) + (r"\b" if pattern[-1].isalnum() else ""))
        return pattern.match(self.text, self.pos)

    def take(self, pattern: re.Pattern | str, expected: str) -> re.Match:
        match = self.peek(pattern)
        if not match:
            raise self.fail(expected)
        self.pos = match.end()
        return match

    def accept(self, word: str) -> bool:
        match = self.peek(word)
        if match:
            self.pos = match.end()
        return bool(match)

    def at_end(self) -> bool:
        self.skip_space()
        return self.pos >= len(self.text)


def _duration(cur: _Cursor) -> float:
    cur.skip_space()
    start = cur.pos
    token = cur.take(_DURATION_TOKEN, "a duration like 90s, 15m or 2h").group(0)
    try:
        return parse_duration(token, "alerts")
    except SpecError:
        raise cur.fail("a positive duration", at=start) from None


def _regex(cur: _Cursor) -> tuple[str, bool]:
    cur.skip_space()
    start = cur.pos
    if not cur.text.startswith("/", start):
        raise cur.fail("a /regular expression/")
    i, chars = start + 1, []
    while i < len(cur.text) and cur.text[i] != "/":
        if cur.text[i] == "\\" and cur.text[i + 1:i + 2] == "/":
            chars.append("/")  # `\/` is how a slash is written inside /.../
            i += 2
            continue
        chars.append(cur.text[i])
        i += 1
    if i >= len(cur.text):
        raise SpecError("alerts", f"{cur.text!r} at position {len(cur.text) + 1}: "
                        "expected the closing '/' of the regular expression")
    pattern = "".join(chars)
    if not pattern:
        raise cur.fail("a non-empty regular expression", at=start + 1)
    try:
        log_regex(pattern, False, rule=cur.text)
    except SpecError:
        try:  # where Python's parser also refuses it, its error names the position
            re.compile(pattern)
        except re.error as error:
            raise cur.fail(f"a valid regular expression ({error.msg})",
                           at=start + 1 + (error.pos or 0)) from None
        raise
    cur.pos = i + 1
    ignore_case = cur.text.startswith("i", cur.pos) and not cur.text[cur.pos + 1:cur.pos + 2].isalnum()
    cur.pos += ignore_case
    return pattern, ignore_case


@functools.lru_cache(maxsize=256)
def log_regex(pattern: str, ignore_case: bool, rule: str | None = None) -> Any:
    """The compiled RE2 of a `log matches` rule (`rule`, its text, for the error); SpecError
    when RE2 is missing or cannot run the pattern in linear time."""
    named = f"{rule!r}: " if rule else ""
    if re2 is None:
        raise SpecError("alerts", f"{named}log matches rules need the google-re2 package (a "
                        "linear-time regex engine), which the launcher cannot import; "
                        "pip install google-re2")
    options = re2.Options()
    options.log_errors = False  # RE2 would print every refused pattern to the launcher's stderr
    options.case_sensitive = not ignore_case
    try:
        return re2.compile(pattern, options)
    except re2.error as error:
        why = error.args[0] if error.args else error
        why = why.decode(errors="replace") if isinstance(why, bytes) else str(why)
        raise SpecError("alerts", f"{named}/{pattern}/ cannot run on RE2, the linear-time engine "
                        f"log rules use ({why}); rewrite it without backreferences or "
                        "lookaround") from None


def _action(cur: _Cursor) -> tuple[str, str | None]:
    if not cur.accept("->"):
        return "notify", None
    for name in ("checkpoint-and-stop", "notify", "stop"):
        if cur.accept(name):
            return name, None
    if cur.accept("webhook"):
        url = cur.take(re.compile(r"\S+"), "a webhook URL").group(0)
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise cur.fail("an http:// or https:// URL", at=cur.pos - len(url))
        return "webhook", url
    raise cur.fail("an action: notify, webhook URL, stop or checkpoint-and-stop")


def parse_rule(text: str) -> Rule:
    """One rule line → `Rule`; a bad line raises `SpecError("alerts", "... at position N: expected ...")`."""
    if not isinstance(text, str):
        raise SpecError("alerts", f"expected a rule string like 'loss is nan -> stop', got {text!r}")
    cur = _Cursor(text)
    fields: dict[str, Any]
    if cur.accept("no"):
        cur.take("progress", "'progress' (as in: no progress for 15m)")
        cur.take("for", "'for' (as in: no progress for 15m)")
        fields = {"kind": "no_progress", "duration": _duration(cur)}
    elif cur.accept("straggler"):
        cur.take("for", "'for' (as in: straggler for 5m)")
        fields = {"kind": "straggler", "duration": _duration(cur)}
    elif cur.peek(re.compile(r"log\s+matches\b")):
        cur.take(re.compile(r"log\s+matches\b"), "'log matches'")
        pattern, ignore_case = _regex(cur)
        fields = {"kind": "log", "pattern": pattern, "ignore_case": ignore_case}
    else:
        metric = cur.take(_NAME, "a metric name, 'no progress for ...' or 'log matches /.../'").group(0)
        if cur.accept("is"):
            cur.take(re.compile(r"nan\b", re.I), "'nan' (as in: loss is nan)")
            fields = {"kind": "nan", "metric": metric}
        else:
            op = cur.take(_OP, "a comparison (<, <=, >, >=, ==, !=) or 'is nan'").group(0)
            factor = cur.peek(_FACTOR)
            if factor and re.compile(r"\s*best\b").match(text, factor.end()):
                cur.pos = factor.end()
                cur.take("best", "'best'")
                cur.take("for", "'for K steps' (as in: loss > 1.2x best for 200 steps)")
                fields = {"kind": "sweep_best", "metric": metric, "op": op, "factor": float(factor.group(1)),
                          "times": _count(cur, "steps", "a whole number of logged steps (as in: for 200 steps)")}
            elif factor and re.compile(r"\s*baseline\b").match(text, factor.end()):
                cur.pos = factor.end()
                cur.take("baseline", "'baseline'")
                if metric == "throughput":
                    cur.take("for", "'for DURATION' (as in: throughput < 0.5x baseline for 5m)")
                    fields = {"kind": "throughput", "op": op, "factor": float(factor.group(1)),
                              "duration": _duration(cur)}
                    action, url = _action(cur)
                    if not cur.at_end():
                        raise cur.fail("'-> ACTION' or the end of the rule")
                    return Rule(text=text, action=action, url=url, **fields)
                fields = {"kind": "baseline", "metric": metric, "op": op, "factor": float(factor.group(1)),
                          "times": _count(cur, "times", "a whole number of consecutive values (as in: 3 times)")}
            else:
                value = float(cur.take(_NUMBER, "a number or 'Nx baseline K times'").group(0))
                duration = _duration(cur) if cur.accept("for") else 0.0
                fields = {"kind": "threshold", "metric": metric, "op": op, "value": value,
                          "duration": duration}
    action, url = _action(cur)
    if not cur.at_end():
        raise cur.fail("'for DURATION', '-> ACTION' or the end of the rule"
                        if fields["kind"] == "threshold" and not fields["duration"] else
                        "'-> ACTION' or the end of the rule")
    return Rule(text=text, action=action, url=url, **fields)


def _count(cur: _Cursor, unit: str, expected: str) -> int:
    """`K times` / `K steps`: a whole number, at least 1, then the unit word."""
    count = int(cur.take(_INT, expected).group(0))
    if count < 1:
        raise cur.fail(f"at least 1 {unit[:-1]}", at=cur.pos - 1)
    cur.take(unit, f"'{unit}'")
    return count


def rules_for(spec_alerts: list[str], default_alerts: bool) -> list[Rule]:
    """The job's rules: the defaults (unless turned off) then the spec's; a spec rule with the
    same condition as a default replaces it (`loss is nan -> stop` overrides the notify)."""
    user = [parse_rule(text) for text in spec_alerts or []]
    taken = {rule.condition for rule in user}
    defaults = [parse_rule(t) for t in DEFAULT_RULES] if default_alerts else []
    rules = [rule for rule in defaults if rule.condition not in taken] + user
    seen, unique = set(), []
    for rule in rules:
        if rule.key not in seen:
            seen.add(rule.key)
            unique.append(rule)
    return unique


# ---------------------------------------------------------------------------------------
# Evaluation.

@dataclass
class JobSnapshot:
    """What the launcher knows of one running job, read from its store each tick.

    `metrics[name]` holds recent points `(t, rank, value)` or `(t, rank, value, device)` of
    both kinds: train values from `log()` and system samples (`gpu_util`, `gpu_mem`,
    `cpu_util`, `mem_used`, with a device like "gpu0"). A window that overlaps the previous
    tick's is fine. Non-finite values are kept as float('nan') / inf.
    """

    metrics: dict[str, list[tuple]] = field(default_factory=dict)
    last_progress: float | None = None  # time of the last completed step (any rank)
    started: float | None = None  # when the current attempt's ranks started
    checkpoints: list[tuple] = field(default_factory=list)  # (t, rank, seconds) per commit
    nan_events: list[tuple] = field(default_factory=list)  # (t, rank, metric name)
    log_lines: list[tuple] = field(default_factory=list)  # (t, rank, text), new since last tick
    # The stragglers named now (stragglers.StragglerDetector.judge: dicts with key, message)
    stragglers: list[dict] = field(default_factory=list)
    progress: tuple | None = None  # (t, highest step, attempt) of the job now
    # Per metric of a `best` rule: (step, value, the sweep's best at that step) of the
    # trial's new rank-0 points, in step order (alerting.SweepBoard).
    sweep_points: dict[str, list[tuple]] = field(default_factory=dict)


@dataclass
class Transition:
    kind: str  # "fired" | "resolved"
    rule: Rule
    t: float
    message: str
    detail: dict[str, Any] = field(default_factory=dict)

    def payload(self, **job: Any) -> dict[str, Any]:
        """The JSON form for the alert event, the stream and webhooks; `job` adds id/name."""
        return {**job, "kind": self.kind, "t": self.t, "message": self.message,
                **self.rule.to_dict(), "detail": self.detail}


def _series_points(snapshot: JobSnapshot, name: str) -> Iterable[tuple[str, float, float]]:
    """(series key, t, value) for a metric; the key is "rank R" or "rank R gpuN"."""
    points = list(snapshot.metrics.get(name, ()))
    if name == "checkpoint_seconds":
        points += list(snapshot.checkpoints)
    for point in points:
        t, rank, value = point[0], point[1], point[2]
        device = point[3] if len(point) > 3 and point[3] else ""
        key = f"rank {rank}" + (f" {device}" if device else "")
        try:
            yield key, float(t), float(value)
        except (TypeError, ValueError):
            continue


def _fmt(value: float) -> str:
    return f"{value:.4g}"


class AlertEvaluator:
    """Turns snapshots into fired/resolved transitions, one per episode per rule.

    Per-series semantics: a series is one rank's metric, or one device of one rank for
    system samples. A rule is active when ANY series meets it, and the transition names
    that series. `for D` means every sample of that series over at least D seconds (first
    to latest sample of the run) met the condition; one sample that does not restarts it.
    """

    def __init__(self, rules: list[Rule]):
        self.rules = list(rules)
        self._state: dict[str, dict[str, Any]] = {rule.key: self._fresh() for rule in self.rules}

    @staticmethod
    def _fresh() -> dict[str, Any]:
        # cursor: last t read per series; series: per-rule memory per series; active: episode open.
        return {"active": False, "since": None, "cursor": {}, "series": {}, "last_match": None}

    def state(self) -> dict[str, Any]:
        """The state itself, not a copy, to be encoded before the next evaluation: a copy
        through JSON (as before) of a 4,096-rank job's state held the GIL 12-28 ms."""
        return self._state

    def load_state(self, state: dict[str, Any]) -> None:
        for key, saved in (state or {}).items():
            if key in self._state and isinstance(saved, dict):
                self._state[key] = {**self._fresh(), **saved}

    def active(self) -> list[dict[str, Any]]:
        """Open episodes, for GET /api/jobs/{id}/alerts."""
        return [{**rule.to_dict(), "active": self._state[rule.key]["active"],
                 "since": self._state[rule.key]["since"]} for rule in self.rules]

    def evaluate(self, now: float, snapshot: JobSnapshot) -> list[Transition]:
        transitions = []
        for rule in self.rules:
            st = self._state[rule.key]
            hit = getattr(self, f"_check_{rule.kind}")(rule, st, now, snapshot)
            if hit is not None and not st["active"]:
                st.update(active=True, since=now)
                transitions.append(Transition("fired", rule, now, f"{rule.condition}: {hit[0]}", hit[1]))
            elif hit is None and st["active"]:
                st.update(active=False, since=None)
                transitions.append(Transition("resolved", rule, now, f"{rule.condition}: cleared", {}))
        return transitions

    @staticmethod
    def _new(st: dict, snapshot: JobSnapshot, name: str) -> list[tuple[str, float, float]]:
        """Points not seen before, in time order, advancing the per-series cursors."""
        cursor = st["cursor"]
        fresh = sorted((p for p in _series_points(snapshot, name) if p[1] > cursor.get(p[0], -math.inf)),
                       key=lambda p: p[1])
        for key, t, _ in fresh:
            cursor[key] = t
        return fresh

    # Each check returns None (condition clear) or (message, detail) naming the series.

    def _check_threshold(self, rule, st, now, snapshot):
        compare = OPS[rule.op]
        runs = st["series"]  # key -> [first t of the current run, latest t, latest value] or None
        for key, t, value in self._new(st, snapshot, rule.metric):
            if compare(value, rule.value):
                run = runs.get(key)
                runs[key] = [run[0] if run else t, t, value]
            else:
                runs[key] = None
        met = [(key, run) for key, run in runs.items() if run and run[1] - run[0] >= rule.duration]
        if not met:
            return None
        key, run = max(met, key=lambda item: item[1][1] - item[1][0])
        held = f" for {format_duration(round(run[1] - run[0]))}" if rule.duration else ""
        return (f"{key} at {_fmt(run[2])}{held}",
                {"series": key, "value": run[2], "since": run[0], "series_met": len(met)})

    @staticmethod
    def _latest_new(st: dict, snapshot: JobSnapshot, name: str) -> list[tuple[str, float, float]]:
        """Of the points not seen before, each series' latest (the last logged, on equal
        times), advancing the cursors as `_new` does: what `is nan` judges, without sorting
        every point of thousands of ranks twice a second."""
        cursor = st["cursor"]
        best: dict[str, tuple[float, float]] = {}
        for key, t, value in _series_points(snapshot, name):
            if t > cursor.get(key, -math.inf):
                held = best.get(key)
                if held is None or t >= held[0]:
                    best[key] = (t, value)
        for key, (t, _value) in best.items():
            cursor[key] = t
        return [(key, t, value) for key, (t, value) in best.items()]

    def _check_nan(self, rule, st, now, snapshot):
        latest = st["series"]  # key -> [t, finite?]
        # A series' state is its latest sample; a nan event at the same time as a point wins.
        events = [(f"rank {rank}", float(t), math.nan) for t, rank, name in snapshot.nan_events
                  if name == rule.metric]
        for key, t, value in self._latest_new(st, snapshot, rule.metric) + events:
            if key not in latest or t >= latest[key][0]:
                latest[key] = [t, math.isfinite(value)]
        bad = sorted(key for key, (t, finite) in latest.items() if not finite)
        if not bad:
            return None
        return f"non-finite {rule.metric} on {', '.join(bad)}", {"series": bad[0], "ranks": bad}

    def _check_no_progress(self, rule, st, now, snapshot):
        reference = snapshot.last_progress if snapshot.last_progress is not None else snapshot.started
        if reference is None or now - reference < rule.duration:
            return None
        what = "last step" if snapshot.last_progress is not None else "start, and no step yet"
        return (f"{format_duration(round(now - reference))} since the {what}",
                {"last_progress": snapshot.last_progress, "started": snapshot.started})

    def _check_sweep_best(self, rule, st, now, snapshot):
        compare = OPS[rule.op]
        s = st["series"].setdefault("trial", {"streak": 0, "last": None})
        for step, value, best in snapshot.sweep_points.get(rule.metric, ()):
            if best is None or not math.isfinite(value):
                continue
            s["streak"] = s["streak"] + 1 if compare(value, rule.factor * best) else 0
            s["last"] = [step, value, best]
        if s["streak"] < rule.times or s["last"] is None:
            return None
        step, value, best = s["last"]
        return (f"{_fmt(value)} at step {step}, {rule.op} {rule.factor:g}x the sweep's best there "
                f"({_fmt(best)}), for {s['streak']} steps",
                {"series": "rank 0", "step": step, "value": value, "best": best, "streak": s["streak"]})

    def _check_baseline(self, rule, st, now, snapshot):
        compare = OPS[rule.op]
        series = st["series"]  # key -> {"first": [...], "baseline": x, "streak": n, "last": v}
        for key, _t, value in self._new(st, snapshot, rule.metric):
            s = series.setdefault(key, {"first": [], "baseline": None, "streak": 0, "last": None})
            if not math.isfinite(value):
                continue  # NaN is the `is nan` rule's business, and would poison a median
            if s["baseline"] is None:
                s["first"].append(value)
                if len(s["first"]) >= BASELINE_WINDOW:
                    s["baseline"], s["first"] = statistics.median(s["first"]), []
                continue
            over = compare(value, rule.factor * s["baseline"])
            s["streak"] = s["streak"] + 1 if over else 0
            s["last"] = value
        met = [(key, s) for key, s in series.items() if s["baseline"] is not None and s["streak"] >= rule.times]
        if not met:
            return None
        key, s = max(met, key=lambda item: item[1]["streak"])
        return (f"{key} at {_fmt(s['last'])}, {s['streak']} values in a row {rule.op} "
                f"{rule.factor:g}x its baseline {_fmt(s['baseline'])}",
                {"series": key, "value": s["last"], "baseline": s["baseline"], "streak": s["streak"]})

    def _check_straggler(self, rule, st, now, snapshot):
        runs = st["series"]  # "rank R" / "node N" -> [first t named, latest t, message]
        named = {f["key"]: f["message"] for f in snapshot.stragglers}
        for key in list(runs):
            if key not in named:
                del runs[key]
        for key, message in named.items():
            runs[key] = [runs[key][0] if key in runs else now, now, message]
        met = [(key, run) for key, run in runs.items() if run[1] - run[0] >= rule.duration]
        if not met:
            return None
        key, run = max(met, key=lambda item: item[1][1] - item[1][0])
        return (f"{run[2]} (for {format_duration(round(run[1] - run[0]))})",
                {"series": key, "since": run[0], "series_met": len(met)})

    def _check_throughput(self, rule, st, now, snapshot):
        s = st["series"] or {}
        st["series"] = s
        if snapshot.progress is None or snapshot.progress[1] is None:
            return None
        t, step, attempt = snapshot.progress
        if s.get("attempt") != attempt:  # a restored attempt's steps go back: measure afresh
            s.update(attempt=attempt, samples=[], run=None)
        samples = s["samples"]
        samples.append([float(t), float(step)])
        while len(samples) > 2 and samples[-1][0] - samples[1][0] >= THROUGHPUT_WINDOW:
            samples.pop(0)
        s.setdefault("first", float(t))
        span = samples[-1][0] - samples[0][0]
        if span < THROUGHPUT_WINDOW / 2:
            return None
        rate = (samples[-1][1] - samples[0][1]) / span
        s["rate"] = rate
        if s.get("baseline") is None:
            since_first = t - s["first"]
            if since_first >= BASELINE_SKIP:
                s.setdefault("pool", []).append(rate)
            if since_first >= BASELINE_SKIP + BASELINE_SPAN and s.get("pool"):
                s["baseline"], s["pool"] = statistics.median(s["pool"]), []
            return None
        if not OPS[rule.op](rate, rule.factor * s["baseline"]):
            s["run"] = None
            return None
        run = s["run"] = [s["run"][0] if s.get("run") else float(t), float(t)]
        if run[1] - run[0] < rule.duration:
            return None
        return (f"{rate:.3g} steps/s, {rule.op} {rule.factor:g}x the baseline {s['baseline']:.3g} "
                f"steps/s for {format_duration(round(run[1] - run[0]))}",
                {"series": "job", "value": rate, "baseline": s["baseline"], "since": run[0]})

    def _check_log(self, rule, st, now, snapshot):
        regex = log_regex(rule.pattern, rule.ignore_case)
        for t, rank, text in snapshot.log_lines:
            if regex.search(str(text)):
                if not st["series"]:  # keep the episode's first line: it is the one worth reading
                    st["series"] = {"rank": rank, "line": str(text)[:500], "count": 0}
                st["series"]["count"] += 1
                st["last_match"] = max(now if t is None else float(t), st["last_match"] or -math.inf)
        if st["last_match"] is None or now - st["last_match"] >= LOG_QUIET_SECONDS:
            st["series"] = {}
            return None
        first = st["series"]
        return (f"rank {first['rank']}: {first['line']}",
                {"series": f"rank {first['rank']}", "rank": first["rank"], "line": first["line"],
                 "count": first["count"]})


# ---------------------------------------------------------------------------------------
# Webhooks.

def webhook_style(url: str) -> str:
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    if host == "oapi.dingtalk.com":
        return "dingtalk"
    if host in ("open.feishu.cn", "open.larksuite.com"):
        return "feishu"
    if host == "hooks.slack.com":
        return "slack"
    return "generic"


def alert_text(payload: dict[str, Any]) -> str:
    # DingTalk robots with keyword security need a fixed word in the text: "jupyter-dlc".
    job = payload.get("job_name") or payload.get("job_id") or payload.get("job") or ""
    head = "resolved" if payload.get("kind") == "resolved" else "ALERT"
    where = f" job {job}" if job else ""
    return f"[jupyter-dlc]{where} {head}: {payload.get('message', payload.get('rule', ''))}"


def webhook_body(url: str, payload: dict[str, Any], style: str | None = None) -> dict[str, Any]:
    """The JSON body each incoming-webhook flavour accepts; `style` overrides the URL's host."""
    text = alert_text(payload)
    style = style or webhook_style(url)
    if style == "dingtalk":
        return {"msgtype": "text", "text": {"content": text}}
    if style == "feishu":
        return {"msg_type": "text", "content": {"text": text}}
    if style == "slack":
        return {"text": text}
    return {"text": text, "alert": payload}


def post_webhook(url: str, alert_payload: dict[str, Any], timeout: float = 5,
                 style: str | None = None) -> tuple[bool, str]:
    """POST the alert; (ok, one-line detail). Never raises: a dead hook must not stop the supervisor."""
    try:
        body = json.dumps(webhook_body(url, alert_payload, style), default=str).encode()
        request = urllib.request.Request(url, data=body, method="POST",
                                         headers={"Content-Type": "application/json; charset=utf-8"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, text = response.status, response.read(4096).decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        return False, f"HTTP {error.code} from {url}: {error.read(300).decode('utf-8', 'replace').strip()}"
    except Exception as error:  # noqa: BLE001 - URLError, timeouts, bad URLs alike
        return False, f"{type(error).__name__} posting to {url}: {error}"
    # DingTalk and Feishu answer HTTP 200 with an error code in the body for a refused message.
    try:
        answer = json.loads(text)
    except ValueError:
        answer = None
    if isinstance(answer, dict):
        code = answer.get("errcode", answer.get("code", answer.get("StatusCode", 0)))
        if code not in (0, None):
            return False, f"HTTP {status} from {url} refused the message: {text.strip()[:300]}"
    return True, f"HTTP {status}"
