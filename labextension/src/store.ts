/**
 * The panel's state, kept pure: no DOM, no JupyterLab, no network. `reduce(state, action)`
 * returns a new state plus the notices the action calls for; the panel renders from the
 * state and turns the notices into JupyterLab notifications. jest tests this module.
 */
import { components, jobStateValues, terminalStateValues } from './wire';

/** The wire types, generated from the launcher's OpenAPI document (`npm run wire`). */
export type Schemas = components['schemas'];
export type JobState = Schemas['JobState'];
export type JobSource = Schemas['Source'];
/** The launcher's job summary, as `GET /api/jobs` and the `job` stream event send it. */
export type JobSummary = Schemas['JobSummary'];
export type JobDetail = Schemas['JobDetail'];
export type Diagnosis = Schemas['Diagnoses']['diagnoses'][number];

export interface LossPoint {
  step: number;
  loss: number;
}

export interface JobEntry {
  job: JobSummary;
  /** bumped on every change of this entry; the view re-renders a row only when it moves */
  rev: number;
  /** (step, loss) pairs seen in summaries, for the row's sparkline */
  history: LossPoint[];
  /** open alerts reported for this job (by rule) */
  alerts: Record<string, AlertInfo>;
}

export interface AlertInfo {
  job_id: string;
  rule: string;
  message: string;
  state: string;
  t?: number;
}

export type ConnectionStatus = 'connecting' | 'live' | 'polling' | 'down';

export interface Connection {
  status: ConnectionStatus;
  /** the one line the panel shows when not live */
  message: string;
  since: number;
}

export interface Filter {
  /** '' = every state; 'active' = not finished; else one state */
  state: string;
  search: string;
}

export interface State {
  jobs: ReadonlyMap<string, JobEntry>;
  /** true once a first list arrived: before that, transitions are not news */
  loaded: boolean;
  connection: Connection;
  filter: Filter;
  selected: string | null;
  /** bumped when the set of jobs or an order/filter-relevant field changes */
  listRev: number;
}

export type Notice = {
  kind: 'error' | 'success' | 'warning' | 'info';
  jobId: string;
  message: string;
};

export type Action =
  | { type: 'snapshot'; jobs: JobSummary[] }
  | { type: 'job'; job: JobSummary }
  | { type: 'removed'; id: string }
  | { type: 'alert'; alert: unknown }
  | { type: 'connection'; status: ConnectionStatus; message?: string; t?: number }
  | { type: 'filter'; state?: string; search?: string }
  | { type: 'select'; id: string | null };

export const TERMINAL: ReadonlySet<string> = new Set(terminalStateValues);
export const JOB_STATES: readonly JobState[] = jobStateValues;
export const HISTORY_LIMIT = 60;

export function isActive(state: JobState): boolean {
  return !TERMINAL.has(state);
}

export function initialState(): State {
  return {
    jobs: new Map(),
    loaded: false,
    connection: { status: 'connecting', message: 'Connecting to the launcher…', since: 0 },
    filter: { state: '', search: '' },
    selected: null,
    listRev: 0
  };
}

function sameJob(a: JobSummary, b: JobSummary): boolean {
  for (const k of Object.keys(b) as (keyof JobSummary)[]) {
    const x = a[k];
    const y = b[k];
    if (x === y) {
      continue;
    }
    if (typeof x === 'object' && typeof y === 'object' && JSON.stringify(x) === JSON.stringify(y)) {
      continue;
    }
    return false;
  }
  return Object.keys(a).length === Object.keys(b).length;
}

function withHistory(history: LossPoint[], job: JobSummary): LossPoint[] {
  const { last_step: step, last_loss: loss } = job;
  if (step === null || step === undefined || typeof loss !== 'number' || !isFinite(loss)) {
    return history;
  }
  const last = history[history.length - 1];
  if (last && last.step === step) {
    if (last.loss === loss) {
      return history;
    }
    return [...history.slice(0, -1), { step, loss }];
  }
  if (last && step < last.step) {
    // a resumed attempt went back to an earlier checkpoint: keep the curve monotone in step
    const kept = history.filter(p => p.step < step);
    return [...kept, { step, loss }];
  }
  const next = [...history, { step, loss }];
  return next.length > HISTORY_LIMIT ? next.slice(next.length - HISTORY_LIMIT) : next;
}

/** What a state change of one job is worth telling the user, if anything. */
export function noticeFor(prev: JobSummary | undefined, next: JobSummary): Notice | null {
  if (!prev || prev.state === next.state) {
    return null;
  }
  if (TERMINAL.has(prev.state) && prev.attempt === next.attempt) {
    return null;
  }
  const name = `${next.name} (${next.id})`;
  const why = next.reason ? `: ${next.reason}` : '';
  if (next.state === 'FAILED') {
    return { kind: 'error', jobId: next.id, message: `DLC job ${name} failed${why}` };
  }
  if (next.state === 'SUCCEEDED') {
    return { kind: 'success', jobId: next.id, message: `DLC job ${name} finished` };
  }
  return null;
}

function upsert(
  jobs: Map<string, JobEntry>,
  job: JobSummary,
  notices: Notice[],
  loaded: boolean
): 'added' | 'changed' | 'same' {
  const prev = jobs.get(job.id);
  if (prev && sameJob(prev.job, job)) {
    return 'same';
  }
  if (loaded) {
    const n = noticeFor(prev?.job, job);
    if (n) {
      notices.push(n);
    }
  }
  const alerts =
    prev && prev.job.attempt !== job.attempt ? {} : prev ? prev.alerts : {};
  jobs.set(job.id, {
    job,
    rev: (prev?.rev ?? 0) + 1,
    history: withHistory(prev?.history ?? [], job),
    alerts
  });
  return prev ? 'changed' : 'added';
}

function listRelevantChange(prev: JobEntry | undefined, next: JobEntry | undefined): boolean {
  if (!prev || !next) {
    return true;
  }
  return (
    prev.job.state !== next.job.state ||
    prev.job.name !== next.job.name ||
    prev.job.created !== next.job.created
  );
}

/**
 * Normalise what the launcher sends as `event: alert` / `event: alert_resolved`: an event row
 * `{seq, job_id, t, attempt, type, state, reason, data}` whose `data` (an object or its JSON
 * text) names the rule.
 */
export function parseAlert(raw: unknown): AlertInfo | null {
  if (!raw || typeof raw !== 'object') {
    return null;
  }
  const a = raw as Record<string, unknown>;
  let data: Record<string, unknown> = {};
  if (typeof a.data === 'string') {
    try {
      const parsed = JSON.parse(a.data);
      data = parsed && typeof parsed === 'object' ? parsed : {};
    } catch {
      data = {};
    }
  } else if (a.data && typeof a.data === 'object') {
    data = a.data as Record<string, unknown>;
  }
  const jobId = (a.job_id ?? data.job_id ?? a.job) as string | undefined;
  if (typeof jobId !== 'string') {
    return null;
  }
  const rule = String(data.rule ?? data.text ?? data.name ?? a.rule ?? a.reason ?? 'alert');
  let state: string;
  if (a.type === 'alert_resolved') {
    state = 'resolved';
  } else if (a.type === 'alert') {
    state = 'firing';
  } else {
    state = String(data.state ?? a.state ?? 'firing');
  }
  const message = String(a.reason ?? data.message ?? rule);
  return { job_id: jobId, rule, message, state, t: typeof a.t === 'number' ? a.t : undefined };
}

export function reduce(state: State, action: Action): { state: State; notices: Notice[] } {
  const notices: Notice[] = [];
  switch (action.type) {
    case 'snapshot': {
      const jobs = new Map(state.jobs);
      let listChanged = false;
      const seen = new Set<string>();
      for (const job of action.jobs) {
        seen.add(job.id);
        const before = jobs.get(job.id);
        const r = upsert(jobs, job, notices, state.loaded);
        if (r !== 'same' && listRelevantChange(before, jobs.get(job.id))) {
          listChanged = true;
        }
      }
      for (const id of state.jobs.keys()) {
        if (!seen.has(id)) {
          jobs.delete(id);
          listChanged = true;
        }
      }
      const selected = state.selected !== null && jobs.has(state.selected) ? state.selected : null;
      return {
        state: {
          ...state,
          jobs,
          loaded: true,
          selected,
          listRev: listChanged || !state.loaded ? state.listRev + 1 : state.listRev
        },
        notices
      };
    }
    case 'job': {
      const before = state.jobs.get(action.job.id);
      const jobs = new Map(state.jobs);
      const r = upsert(jobs, action.job, notices, state.loaded);
      if (r === 'same') {
        return { state, notices };
      }
      const listChanged = listRelevantChange(before, jobs.get(action.job.id));
      return {
        state: { ...state, jobs, listRev: listChanged ? state.listRev + 1 : state.listRev },
        notices
      };
    }
    case 'removed': {
      if (!state.jobs.has(action.id)) {
        return { state, notices };
      }
      const jobs = new Map(state.jobs);
      jobs.delete(action.id);
      return {
        state: {
          ...state,
          jobs,
          selected: state.selected === action.id ? null : state.selected,
          listRev: state.listRev + 1
        },
        notices
      };
    }
    case 'alert': {
      const alert = parseAlert(action.alert);
      if (!alert) {
        return { state, notices };
      }
      const entry = state.jobs.get(alert.job_id);
      const firing = !/resolv|^ok$|clear/i.test(alert.state);
      const wasFiring = !!entry?.alerts[alert.rule];
      if (firing && !wasFiring) {
        const name = entry ? `${entry.job.name} (${alert.job_id})` : alert.job_id;
        notices.push({
          kind: 'warning',
          jobId: alert.job_id,
          message: `DLC job ${name}: alert ${alert.rule}${
            alert.message && alert.message !== alert.rule ? ` — ${alert.message}` : ''
          }`
        });
      }
      if (!entry) {
        return { state, notices };
      }
      const alerts = { ...entry.alerts };
      if (firing) {
        alerts[alert.rule] = alert;
      } else {
        delete alerts[alert.rule];
      }
      const jobs = new Map(state.jobs);
      jobs.set(alert.job_id, { ...entry, alerts, rev: entry.rev + 1 });
      return { state: { ...state, jobs }, notices };
    }
    case 'connection': {
      const c = state.connection;
      const message = action.message ?? defaultMessage(action.status);
      if (c.status === action.status && c.message === message) {
        return { state, notices };
      }
      return {
        state: {
          ...state,
          connection: {
            status: action.status,
            message,
            since: c.status === action.status ? c.since : action.t ?? Date.now()
          }
        },
        notices
      };
    }
    case 'filter': {
      const filter = {
        state: action.state ?? state.filter.state,
        search: action.search ?? state.filter.search
      };
      if (filter.state === state.filter.state && filter.search === state.filter.search) {
        return { state, notices };
      }
      return { state: { ...state, filter, listRev: state.listRev + 1 }, notices };
    }
    case 'select':
      return { state: { ...state, selected: action.id }, notices };
  }
  return { state, notices };
}

function defaultMessage(status: ConnectionStatus): string {
  switch (status) {
    case 'live':
      return '';
    case 'connecting':
      return 'Connecting to the launcher…';
    case 'polling':
      return 'Live updates interrupted; polling the launcher.';
    case 'down':
      return 'Launcher unreachable; retrying.';
  }
  return '';
}

/** Does a job pass the filter? */
export function matches(job: JobSummary, filter: Filter): boolean {
  if (filter.state === 'active') {
    if (!isActive(job.state)) {
      return false;
    }
  } else if (filter.state && job.state !== filter.state) {
    return false;
  }
  const q = filter.search.trim().toLowerCase();
  if (q && !job.name.toLowerCase().includes(q) && !job.id.toLowerCase().includes(q)) {
    return false;
  }
  return true;
}

/** Ids to show, newest first. */
export function visibleIds(state: State): string[] {
  return visibleTree(state).map(row => row.id);
}

/**
 * The visible jobs in tree order, each with its depth: newest first, and each job followed
 * by its branches (`parent`, from `--from JOB@STEP`), newest first. A branch whose parent is
 * not visible (filtered out, deleted) stands at the top.
 */
export function visibleTree(state: State): { id: string; depth: number }[] {
  const shown: JobSummary[] = [];
  for (const e of state.jobs.values()) {
    if (matches(e.job, state.filter)) {
      shown.push(e.job);
    }
  }
  shown.sort((a, b) => (b.created ?? 0) - (a.created ?? 0) || (a.id < b.id ? 1 : -1));
  const ids = new Set(shown.map(j => j.id));
  const children = new Map<string | null, string[]>();
  for (const j of shown) {
    const parent = j.parent && ids.has(j.parent.job) ? j.parent.job : null;
    const list = children.get(parent) ?? [];
    list.push(j.id);
    children.set(parent, list);
  }
  const out: { id: string; depth: number }[] = [];
  const stack = (children.get(null) ?? []).map(id => ({ id, depth: 0 })).reverse();
  while (stack.length) {
    const row = stack.pop()!;
    out.push(row);
    const below = children.get(row.id) ?? [];
    for (let i = below.length - 1; i >= 0; i--) {
      stack.push({ id: below[i], depth: row.depth + 1 });
    }
  }
  return out;
}

/** Counts per state, for the filter's labels. */
export function stateCounts(state: State): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const e of state.jobs.values()) {
    counts[e.job.state] = (counts[e.job.state] ?? 0) + 1;
  }
  return counts;
}

/** Backoff for reconnects: 1 s, 2 s, 4 s … capped; `hidden` waits longer. */
export function backoffMs(attempt: number, hidden = false): number {
  const cap = hidden ? 30000 : 10000;
  return Math.min(cap, 1000 * Math.pow(2, Math.max(0, attempt)));
}

/** "42s", "5m", "3h", "2d": how long ago `t` (seconds since epoch) was. */
export function age(t: number | null | undefined, nowMs: number): string {
  if (t === null || t === undefined) {
    return '';
  }
  const s = Math.max(0, Math.round(nowMs / 1000 - t));
  if (s < 60) {
    return `${s}s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)}m`;
  }
  if (s < 86400) {
    return `${Math.floor(s / 3600)}h`;
  }
  return `${Math.floor(s / 86400)}d`;
}

/**
 * Server-sent events, parsed incrementally: feed text chunks as they arrive, get whole
 * events back.
 */
/**
 * The store action for one event of the launcher's stream (`event: job|deleted|alert|...`),
 * or null for events the store does not keep. A `job` event carries a JobSummary.
 */
export function streamAction(event: string, data: string): Action | null {
  let parsed: unknown;
  try {
    parsed = JSON.parse(data);
  } catch {
    return null;
  }
  if (!parsed || typeof parsed !== 'object') {
    return null;
  }
  const d = parsed as Record<string, unknown>;
  if (event === 'job' && typeof d.id === 'string') {
    return d.deleted ? { type: 'removed', id: d.id } : { type: 'job', job: parsed as JobSummary };
  }
  if (event === 'deleted' && typeof (d.id ?? d.job_id) === 'string') {
    return { type: 'removed', id: String(d.id ?? d.job_id) };
  }
  if (event === 'alert' || event === 'alert_resolved') {
    return { type: 'alert', alert: parsed };
  }
  return null;
}

export class SseParser {
  private buf = '';
  private event = '';
  private data: string[] = [];

  feed(chunk: string): { event: string; data: string }[] {
    this.buf += chunk;
    const out: { event: string; data: string }[] = [];
    let i: number;
    while ((i = this.buf.search(/\r\n|\r|\n/)) >= 0) {
      const line = this.buf.slice(0, i);
      const nl = this.buf[i] === '\r' && this.buf[i + 1] === '\n' ? 2 : 1;
      if (this.buf[i] === '\r' && i + 1 === this.buf.length) {
        break; // maybe a \r\n split across chunks
      }
      this.buf = this.buf.slice(i + nl);
      if (line === '') {
        if (this.data.length) {
          out.push({ event: this.event || 'message', data: this.data.join('\n') });
        }
        this.event = '';
        this.data = [];
        continue;
      }
      if (line.startsWith(':')) {
        continue;
      }
      const c = line.indexOf(':');
      const field = c < 0 ? line : line.slice(0, c);
      let value = c < 0 ? '' : line.slice(c + 1);
      if (value.startsWith(' ')) {
        value = value.slice(1);
      }
      if (field === 'event') {
        this.event = value;
      } else if (field === 'data') {
        this.data.push(value);
      }
    }
    return out;
  }
}

/** SVG path ("M x y L …") of a sparkline through `values`, scaled into w × h. */
export function sparklinePath(values: number[], w: number, h: number, pad = 1): string {
  const v = values.filter(x => typeof x === 'number' && isFinite(x));
  if (v.length === 0) {
    return '';
  }
  let lo = Math.min(...v);
  let hi = Math.max(...v);
  if (hi === lo) {
    hi += 1;
    lo -= 1;
  }
  const n = v.length;
  const pts = v.map((y, i) => {
    const px = n === 1 ? w / 2 : pad + (i * (w - 2 * pad)) / (n - 1);
    const py = pad + (1 - (y - lo) / (hi - lo)) * (h - 2 * pad);
    return `${px.toFixed(1)} ${py.toFixed(1)}`;
  });
  return 'M' + pts.join(' L');
}
