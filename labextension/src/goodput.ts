/**
 * The goodput ledger as the panel shows it: one stacked bar of where a job's wall time went
 * with its percentage (the detail view), the percentage alone (the list), and progress with
 * its ETA ("step 256 / 400, ETA 7 s"). The launcher computes the ledger
 * (jupyter_dlc/launcher/goodput.py); the notebook view draws the same bar
 * (jupyter_dlc/widgets/job_html.py, same parts, labels and colours). No JupyterLab imports
 * (jest-tested).
 */
import { components } from './wire';

type Schemas = components['schemas'];
export type Goodput = Schemas['Goodput'];
export type Progress = Schemas['Progress'];
type Part = keyof Schemas['GoodputParts'];

/** The parts in the order the bar stacks them: [key, label, colour]. */
export const GOODPUT_PARTS: [Part, string, string][] = [
  ['productive', 'productive', '#2e7d32'],
  ['data_wait', 'data wait', '#f9a825'],
  ['checkpoint_stall', 'checkpoint stall', '#6a1b9a'],
  ['startup', 'start-up', '#0277bd'],
  ['waiting', 'waiting', '#9e9e9e'],
  ['lost_work', 'lost work', '#c62828'],
  ['restart_downtime', 'restart downtime', '#ef6c00'],
  ['hung', 'hung', '#4e342e'],
  ['stopped', 'stopped', '#607d8b'],
  ['shutdown', 'shutdown', '#b0bec5']
];

/** "83%" (one decimal under 10%), "" when there is none yet. */
export function percentText(ratio: number | null | undefined): string {
  if (ratio === null || ratio === undefined) {
    return '';
  }
  const value = 100 * ratio;
  return value < 10 ? `${value.toFixed(1)}%` : `${Math.round(value)}%`;
}

/** 7 s, 3 min 20 s, 2 h 5 min. */
export function durationText(seconds: number): string {
  const s = Math.round(seconds);
  if (s < 60) {
    return `${s} s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)} min ${s % 60} s`;
  }
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

/** "step 256 / 400, ETA 7 s"; "step 256" without a total; "" without either. */
export function progressText(p: Progress | null | undefined): string {
  if (!p || (p.step === null && p.total_steps === null)) {
    return '';
  }
  let text = `step ${p.step ?? 0}`;
  if (p.total_steps) {
    text += ` / ${p.total_steps}`;
    if (p.eta_seconds !== null && p.eta_seconds !== undefined) {
      text += `, ETA ${durationText(p.eta_seconds)}`;
    }
  }
  return text;
}

export interface Segment {
  part: string;
  label: string;
  colour: string;
  seconds: number;
  /** percent of the wall time */
  share: number;
}

/** The bar's segments: the parts that took any time, as shares of the wall time. */
export function goodputSegments(g: Goodput): Segment[] {
  if (!g.wall_seconds) {
    return [];
  }
  return GOODPUT_PARTS.filter(([key]) => g.parts[key] > 0).map(([key, label, colour]) => ({
    part: key,
    label,
    colour,
    seconds: g.parts[key],
    share: (100 * g.parts[key]) / g.wall_seconds
  }));
}

/** The stacked bar with the percentage and a legend, as DOM (textContent only). */
export function renderGoodputBar(g: Goodput): HTMLElement {
  const box = document.createElement('div');
  box.className = 'dlc-goodput';
  const head = document.createElement('div');
  head.append('goodput ');
  const value = document.createElement('b');
  value.className = 'dlc-goodput-value';
  value.textContent = percentText(g.goodput) || '–';
  head.append(value, ` of ${durationText(g.wall_seconds)}`);
  const bar = document.createElement('div');
  bar.className = 'dlc-goodput-bar';
  const legend = document.createElement('div');
  legend.className = 'dlc-goodput-legend';
  for (const s of goodputSegments(g)) {
    const part = document.createElement('div');
    part.className = 'dlc-goodput-part';
    part.dataset.part = s.part;
    part.style.width = `${s.share.toFixed(3)}%`;
    part.style.background = s.colour;
    part.title = `${s.label}: ${durationText(s.seconds)} (${s.share.toFixed(1)}%)`;
    bar.appendChild(part);
    if (s.seconds >= 0.5) {
      const item = document.createElement('span');
      const swatch = document.createElement('span');
      swatch.style.color = s.colour;
      swatch.textContent = '■ ';
      item.append(swatch, part.title);
      legend.appendChild(item);
    }
  }
  box.append(head, bar, legend);
  return box;
}
