/**
 * What the detail view shows of each launcher payload, as plain data: the one place that
 * reads the wire's field names (typed by src/wire.ts, generated from the launcher's OpenAPI
 * document). No DOM and no JupyterLab, so jest feeds it real launcher payloads
 * (test/contract.test.ts).
 */
import { age } from './store';
import { components } from './wire';

type Schemas = components['schemas'];
export type Rank = Schemas['Rank'];
export type LogLine = Schemas['LogLine'];
export type Alert = Schemas['Alert'];
export type Checkpoint = Schemas['Checkpoint'];
export type Diagnosis = Schemas['Diagnoses']['diagnoses'][number];
export type Straggler = Schemas['Straggler'];
export type Verdict = Schemas['PerformanceVerdict'];

export const RANK_COLUMNS = ['rank', 'node', 'local', 'pid', 'state', 'exit', 'step', 'heartbeat'];

/** One row of the ranks table, in RANK_COLUMNS order. */
export function rankCells(r: Rank, nowMs: number): string[] {
  return [
    r.rank,
    r.node ?? '',
    r.local_rank ?? '',
    r.pid ?? '',
    r.state ?? '',
    r.exit_code ?? '',
    r.last_step ?? '',
    r.last_heartbeat ? `${age(r.last_heartbeat, nowMs)} ago` : ''
  ].map(String);
}

/** The log tail: every rank's lines prefixed with the rank, or one rank's lines as they are. */
export function logText(lines: LogLine[], oneRank: boolean): string {
  return lines.map(l => (oneRank ? l.text : `[${l.rank}] ${l.text}`)).join('\n');
}

/** One alert rule: its condition, action and whether an episode is open. */
export function alertLine(a: Alert): { text: string; firing: boolean } {
  const firing = a.active === true;
  const since =
    firing && a.since ? ` · firing since ${new Date(a.since * 1000).toLocaleTimeString()}` : '';
  return { text: `${a.condition} → ${a.action}${since}`, firing };
}

/** A diagnosis: its head (attempt, class, rank), the first error line, what to do. */
export function diagnosisParts(d: Diagnosis): { head: string; line: string; hint: string } {
  const head = [
    `attempt ${d.attempt}`,
    d.class,
    d.rank !== undefined && d.rank !== null ? `rank ${d.rank}` : ''
  ]
    .filter(Boolean)
    .join(' · ');
  return { head, line: d.line ?? '', hint: d.suggestion ?? '' };
}

/** The straggler banner: one line per rank or node the launcher names now, with its reason. */
export function stragglerLines(stragglers: Straggler[] | undefined): string[] {
  return (stragglers ?? []).map(s => `straggler: ${s.message}`);
}

/** The performance verdict of a job that did not fail: its head, figures and what to do. */
export function verdictParts(v: Verdict): { head: string; line: string; hint: string } {
  return { head: `performance: ${v.verdict}`, line: v.line, hint: v.suggestion };
}

/** A checkpoint in the resume picker. */
export function checkpointLabel(c: Checkpoint, fmtTime: (t: number | null | undefined) => string): string {
  return `step ${c.step} · ${fmtTime(c.time)} · world ${c.world_size ?? '?'}`;
}

/** The rank table's orders: the launcher's keys (`rank_sort`, RANK_ORDERS in
 * launcher/store.py), labelled as in the notebook view (jupyter_dlc/widgets/ranktable.py). */
export const RANK_SORTS: [RankOrder, string][] = [
  ['rank', 'by rank'],
  ['step', 'slowest step first'],
  ['heartbeat', 'oldest heartbeat first']
];
export type RankOrder = Schemas['RankPage']['sort'];
export const RANK_PAGE_SIZE = 50;

/** The pager's text: every rank counted, and where this page is. */
export function rankPagerText(p: { total: number; page: number; pages: number }): string {
  return `${p.total} ranks · page ${p.page + 1} of ${p.pages}`;
}

/** How many ranks are in each state, of all the job's ranks (not of the page shown). */
export function rankStatesText(states: Record<string, number>): string {
  return Object.entries(states)
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([state, n]) => `${n} ${state}`)
    .join(' · ');
}
