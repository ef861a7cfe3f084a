/**
 * The detail's "where each step goes" chart: stacked bars per step of data wait, gradient
 * sync, checkpoint stall and compute (step time less the three), from the breakdown metrics
 * every rank logs at each `runtime.log` (jupyter_dlc/runtime/breakdown.py). Each part is the
 * median over the ranks that logged the step; past MAX_RANK_LINES ranks the launcher folds
 * the ranks into band rows, so it is the band's mean there. The same rule, parts, labels and
 * colours as the notebook view (jupyter_dlc/widgets/series.py step_breakdown, charts.py
 * steps_fig). Computed from the points the detail already holds (JobMetrics), nothing
 * fetched. No JupyterLab imports (jest-tested).
 */
import { Band, SVG_NS, Series, chartSvg } from './charts';

/** The metric that holds the step time (ms between `runtime.log` calls). */
export const STEP_MS = 'step_ms';

/** The stacked parts, bottom up: [key, metric (null: the rest), label, colour]. */
export const STEP_PARTS: [StepPart, string | null, string, string][] = [
  ['data', 'data_wait_ms', 'data wait', '#ff7f0e'],
  ['sync', 'grad_sync_ms', 'gradient sync', '#d62728'],
  ['ckpt', 'ckpt_stall_ms', 'checkpoint stall', '#9467bd'],
  ['compute', null, 'compute (the rest)', '#b0bec5']
];
export type StepPart = 'data' | 'sync' | 'ckpt' | 'compute';

/** The breakdown's metric names (the line charts leave them to this chart). */
export const BREAKDOWN_NAMES = [STEP_MS, ...STEP_PARTS.map(([, m]) => m).filter((m): m is string => m !== null)];

/** How many of the most recent steps the chart draws (as the notebook's BREAKDOWN_STEPS). */
export const STEPS_SHOWN = 200;
/** The chart is redrawn at most this often while points come (as the notebook view). */
export const STEPS_REDRAW_MS = 1000;

export type StepRow = { step: number } & Record<StepPart, number>;

/** What JobMetrics.chart gives for a metric: per-rank lines, or past 8 ranks a band. */
export type ChartOf = (name: string) => { series: Series[]; band?: Band };

function median(values: number[]): number {
  const s = [...values].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

/** The last `last` points of a line as a map step -> value (a resumed step: the newest). */
function byStep(points: [number, number][], last: number): Map<number, number> {
  return new Map(points.slice(-last));
}

/**
 * The stacked parts of the last `last` steps, step ascending: per rank (or the band's mean),
 * each part its logged value (0 when not logged that step) and compute the step less the
 * three, never below 0; then per step each part the median over the ranks. [] until a rank
 * logs `step_ms`.
 */
export function stepRows(chartOf: ChartOf, last = STEPS_SHOWN): StepRow[] {
  const lines = new Map<string, [number, number][]>(); // label -> step_ms line
  const step = chartOf(STEP_MS);
  const fromBand = (band: Band | undefined): [number, number][] => (band?.rows ?? []).map(([x, mean]) => [x, mean]);
  if (step.band) {
    lines.set('mean', fromBand(step.band));
  } else {
    for (const s of step.series) {
      lines.set(s.label, s.points);
    }
  }
  const parts = STEP_PARTS.filter(([, m]) => m !== null).map(([, metric]) => {
    const of = chartOf(metric!);
    const byLabel = new Map<string, Map<number, number>>();
    if (of.band) {
      byLabel.set('mean', byStep(fromBand(of.band), last));
    } else {
      for (const s of of.series) {
        byLabel.set(s.label, byStep(s.points, last));
      }
    }
    return byLabel;
  });
  const atStep = new Map<number, number[][]>();
  for (const [label, points] of lines) {
    const own = parts.map(p => p.get(label));
    for (const [x, total] of byStep(points, last)) {
      const values = own.map(p => p?.get(x) ?? 0);
      const rest = Math.max(0, total - values.reduce((a, b) => a + b, 0));
      let rows = atStep.get(x);
      if (!rows) {
        atStep.set(x, (rows = []));
      }
      rows.push([...values, rest]);
    }
  }
  const keys = STEP_PARTS.map(([k]) => k);
  return [...atStep.keys()]
    .sort((a, b) => a - b)
    .slice(-last)
    .map(x => {
      const rows = atStep.get(x)!;
      const row = { step: x } as StepRow;
      keys.forEach((k, i) => (row[k] = median(rows.map(r => r[i]))));
      return row;
    });
}

/** The chart's title: whose steps it shows. */
export function stepsTitle(band: boolean, world: number): string {
  return `where each step goes (${band ? `mean of ${world} ranks` : 'median of the ranks'})`;
}

/**
 * Stacked bars of `rows` as SVG (plain SVG, as the detail's line charts): one <g> a step
 * with a <rect> a part that took time, a <title> with the figures, and a legend.
 */
export function stepChart(title: string, rows: StepRow[], opts: { width?: number; height?: number } = {}): SVGSVGElement {
  const box = { W: opts.width ?? 420, H: opts.height ?? 140, L: 50, R: 104, T: 16, B: 16 };
  const { W, H, L, R, T, B } = box;
  const { svg, text } = chartSvg(title, box, 'dlc-chart dlc-steps-chart');
  svg.dataset.chart = 'steps';
  svg.dataset.steps = String(rows.length);
  const totals = rows.map(r => STEP_PARTS.reduce((sum, [k]) => sum + r[k], 0));
  const top = Math.max(1e-9, ...totals);
  const x0 = rows.length ? rows[0].step : 0;
  const span = rows.length ? Math.max(1, rows[rows.length - 1].step - x0 + 1) : 1;
  const width = (W - L - R) / span;
  const sy = (ms: number) => ((H - T - B) * ms) / top;
  text(L - 3, T + 8, `${top.toFixed(top >= 100 ? 0 : 1)} ms`, 'end');
  text(L - 3, H - B, '0', 'end');
  text(W - R, H - 3, 'step', 'end');
  rows.forEach((r, i) => {
    const g = document.createElementNS(SVG_NS, 'g');
    g.setAttribute('class', 'dlc-step-bar');
    g.dataset.step = String(r.step);
    const x = L + (r.step - x0) * width;
    let y = H - B;
    for (const [k, , , colour] of STEP_PARTS) {
      if (!(r[k] > 0)) {
        continue;
      }
      const h = sy(r[k]);
      y -= h;
      const rect = document.createElementNS(SVG_NS, 'rect');
      rect.setAttribute('x', (x + width * 0.05).toFixed(2));
      rect.setAttribute('y', y.toFixed(2));
      rect.setAttribute('width', Math.max(0.5, width * 0.9).toFixed(2));
      rect.setAttribute('height', h.toFixed(2));
      rect.setAttribute('fill', colour);
      rect.dataset.part = k;
      g.appendChild(rect);
    }
    const tip = document.createElementNS(SVG_NS, 'title');
    tip.textContent =
      `step ${r.step}: ${totals[i].toFixed(1)} ms · ` +
      STEP_PARTS.map(([k, , label]) => `${label.replace(' (the rest)', '')} ${r[k].toFixed(1)} ms`).join(' · ');
    g.appendChild(tip);
    svg.appendChild(g);
  });
  STEP_PARTS.forEach(([, , label, colour], i) => text(W - R + 6, T + 10 + i * 12, `■ ${label}`, 'start', 'dlc-chart-legend', colour));
  return svg;
}
