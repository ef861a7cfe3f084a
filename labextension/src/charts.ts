/**
 * Plain SVG line charts for the detail view, and the grouping of launcher metric points
 * into series. No JupyterLab imports (jest-tested).
 */
import { components } from './wire';

/** A point of `GET /api/jobs/{job}/metrics` (generated from the launcher's OpenAPI document). */
export type MetricPoint = components['schemas']['MetricPoint'];

export interface Series {
  label: string;
  points: [number, number][];
  /** drawn dashed and grey, under the others (a branch's parent up to the branch step) */
  muted?: boolean;
}

const MUTED = '#b0bec5';

export const SVG_NS = 'http://www.w3.org/2000/svg';
const COLORS = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#17becf'];
export const MAX_POINTS_PER_SERIES = 2000;

/** `map`'s value at `key`, made and stored first when it has none. */
export function entry<K, V>(map: Map<K, V>, key: K, make: () => V): V {
  let value = map.get(key);
  if (value === undefined) {
    value = make();
    map.set(key, value);
  }
  return value;
}

/**
 * Keep a line bounded: past MAX_POINTS_PER_SERIES points, every other point of the older
 * half goes (bounded memory, the whole history's shape).
 */
export function thin<T>(pts: T[]): void {
  if (pts.length > MAX_POINTS_PER_SERIES) {
    const half = Math.floor(pts.length / 2);
    const thinned = pts.slice(0, half).filter((_, i) => i % 2 === 0);
    pts.splice(0, half, ...thinned);
  }
}

/**
 * Accumulates metric points into series: train metrics by (name, rank) against step (a job
 * of up to MAX_RANK_LINES ranks; past that, bands.ts BandSeries draws them); system metrics
 * by (name, node/device) against time.
 */
export class MetricSeries {
  private series = new Map<string, Map<string, [number, number][]>>();

  add(points: MetricPoint[]): void {
    for (const p of points) {
      if (typeof p.value !== 'number' || !isFinite(p.value)) {
        continue;
      }
      let chart: string;
      let label: string;
      let x: number;
      if (p.kind === 'train') {
        if (p.step === null || p.step === undefined) {
          continue;
        }
        chart = p.name;
        label = `rank ${p.rank ?? '?'}`;
        x = p.step;
      } else {
        chart = p.name;
        label = `node ${p.node ?? '?'} ${p.device ?? ''}`.trim();
        x = p.t;
      }
      const pts = entry(entry(this.series, chart, () => new Map()), label, () => []);
      pts.push([x, p.value]);
      thin(pts);
    }
  }

  charts(): string[] {
    return [...this.series.keys()];
  }

  get(chart: string): Series[] {
    const byLabel = this.series.get(chart);
    if (!byLabel) {
      return [];
    }
    return [...byLabel.entries()]
      .sort(([a], [b]) => a.localeCompare(b, undefined, { numeric: true }))
      .map(([label, points]) => ({ label, points }));
  }
}

/** Past this many series a chart draws the mean with a min-max band, plus the outliers. */
export const MAX_RANK_LINES = 8;
export const MAX_OUTLIERS = 3;

/**
 * The series whose value at one x lies far from the others: more than 5 scaled median
 * absolute deviations from the median (every differing one when all others agree), farthest
 * first. The same rule as the notebook view (jupyter_dlc/widgets/series.py outlier_ranks).
 */
export function outliersAt(values: Map<string, number>): { label: string; distance: number }[] {
  if (values.size < 3) {
    return [];
  }
  const ordered = [...values.values()].sort((a, b) => a - b);
  const median = ordered[Math.floor(ordered.length / 2)];
  const deviations = ordered.map(v => Math.abs(v - median)).sort((a, b) => a - b);
  const mad = deviations[Math.floor(deviations.length / 2)] * 1.4826;
  const bound = mad > 0 ? 5 * mad : 1e-12 * Math.max(1, Math.abs(median));
  const far: { label: string; distance: number }[] = [];
  for (const [label, v] of values) {
    const distance = Math.abs(v - median);
    if (distance > bound) {
      far.push({ label, distance: mad > 0 ? distance / mad : Infinity });
    }
  }
  return far.sort((a, b) => b.distance - a.distance);
}

/** A mean with its min-max band, standing for many series. */
export interface Band {
  /** [x, mean, min, max] per x, x ascending */
  rows: [number, number, number, number][];
  /** how many series it stands for (the legend's "mean of N") */
  of: number;
}

/**
 * Mean and min-max band over `series` at every x, and the outlier series: for system
 * metrics of more than MAX_RANK_LINES nodes/devices, which come as points. Train metrics
 * past MAX_RANK_LINES ranks come folded by the launcher instead (bands.ts BandSeries).
 */
export function bandOf(series: Series[], limit = MAX_OUTLIERS): { band: Band; outliers: Series[] } {
  const byX = new Map<number, Map<string, number>>();
  for (const s of series) {
    for (const [x, y] of s.points) {
      entry(byX, x, () => new Map<string, number>()).set(s.label, y);
    }
  }
  const rows: [number, number, number, number][] = [];
  const worst = new Map<string, number>();
  for (const x of [...byX.keys()].sort((a, b) => a - b)) {
    const at = byX.get(x)!;
    let sum = 0;
    let lo = Infinity;
    let hi = -Infinity;
    for (const v of at.values()) {
      sum += v;
      lo = Math.min(lo, v);
      hi = Math.max(hi, v);
    }
    rows.push([x, sum / at.size, lo, hi]);
    for (const { label, distance } of outliersAt(at)) {
      worst.set(label, Math.max(worst.get(label) ?? 0, distance));
    }
  }
  const picked = [...worst.entries()].sort((a, b) => b[1] - a[1]).slice(0, limit).map(([l]) => l);
  return {
    band: { rows, of: series.length },
    outliers: series.filter(s => picked.includes(s.label)).map(s => ({ ...s, label: `${s.label} (outlier)` }))
  };
}

function fmt(v: number): string {
  if (v === 0) {
    return '0';
  }
  const a = Math.abs(v);
  if (a >= 10000 || a < 0.001) {
    return v.toExponential(1);
  }
  return a >= 100 ? v.toFixed(0) : a >= 1 ? v.toFixed(2) : v.toFixed(3);
}

/** A chart's box in px: width, height and the margins left, right, top, bottom. */
export interface ChartBox {
  W: number;
  H: number;
  L: number;
  R: number;
  T: number;
  B: number;
}

/** An empty chart: the <svg> (data-chart = `title`), its title and its frame, and a helper
 * that adds a text. */
export function chartSvg(
  title: string,
  { W, H, L, R, T, B }: ChartBox,
  cls = 'dlc-chart'
): { svg: SVGSVGElement; text: (x: number, y: number, s: string, anchor?: string, cls?: string, fill?: string) => void } {
  const svg = document.createElementNS(SVG_NS, 'svg');
  svg.setAttribute('class', cls);
  svg.setAttribute('width', String(W));
  svg.setAttribute('height', String(H));
  svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
  svg.dataset.chart = title;
  const text = (x: number, y: number, s: string, anchor = 'start', textCls = 'dlc-chart-text', fill?: string) => {
    const t = document.createElementNS(SVG_NS, 'text');
    t.setAttribute('x', String(x));
    t.setAttribute('y', String(y));
    t.setAttribute('text-anchor', anchor);
    t.setAttribute('class', textCls);
    if (fill) {
      t.setAttribute('fill', fill);
    }
    t.textContent = s;
    svg.appendChild(t);
  };
  text(L, 11, title, 'start', 'dlc-chart-title');
  const frame = document.createElementNS(SVG_NS, 'rect');
  frame.setAttribute('x', String(L));
  frame.setAttribute('y', String(T));
  frame.setAttribute('width', String(W - L - R));
  frame.setAttribute('height', String(H - T - B));
  frame.setAttribute('class', 'dlc-chart-frame');
  svg.appendChild(frame);
  return { svg, text };
}

/**
 * An SVG line chart of `series` (x ascending per series). With `opts.band`, the band and its
 * mean are drawn and `series` are its outlier lines; without, more than MAX_RANK_LINES
 * series are drawn as their band (`bandOf`).
 */
export function lineChart(
  title: string,
  series: Series[],
  opts: { width?: number; height?: number; xLabel?: string; band?: Band } = {}
): SVGSVGElement {
  const W = opts.width ?? 260;
  const H = opts.height ?? 110;
  const L = 40;
  const R = 6;
  const T = 16;
  const B = 16;
  const { svg, text } = chartSvg(title, { W, H, L, R, T, B });
  let x0 = Infinity;
  let x1 = -Infinity;
  let y0 = Infinity;
  let y1 = -Infinity;
  let band = opts.band ?? null;
  if (!band && series.length > MAX_RANK_LINES) {
    const computed = bandOf(series);
    band = computed.band;
    series = computed.outliers;
  }
  const extend = (x: number, ylo: number, yhi: number) => {
    x0 = Math.min(x0, x);
    x1 = Math.max(x1, x);
    y0 = Math.min(y0, ylo);
    y1 = Math.max(y1, yhi);
  };
  for (const s of series) {
    for (const [x, y] of s.points) {
      extend(x, y, y);
    }
  }
  for (const [x, , lo, hi] of band?.rows ?? []) {
    extend(x, lo, hi);
  }
  if (!isFinite(x0)) {
    text(W / 2, H / 2 + 4, 'no data yet', 'middle');
    return svg;
  }
  if (x1 === x0) {
    x1 = x0 + 1;
  }
  if (y1 === y0) {
    y1 = y0 + Math.abs(y0 || 1) * 0.1;
    y0 = y0 - Math.abs(y0 || 1) * 0.1;
  }
  const sx = (x: number) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y: number) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  text(L - 3, T + 8, fmt(y1), 'end');
  text(L - 3, H - B, fmt(y0), 'end');
  if (opts.xLabel) {
    text(W - R, H - 3, opts.xLabel, 'end');
  }
  if (band) {
    // the min-max area, then the mean; the outliers are drawn as the lines below
    const area = document.createElementNS(SVG_NS, 'path');
    const top = band.rows.map(([x, , , hi], k) => `${k ? 'L' : 'M'}${sx(x).toFixed(1)} ${sy(hi).toFixed(1)}`);
    const bottom = [...band.rows].reverse().map(([x, , lo]) => `L${sx(x).toFixed(1)} ${sy(lo).toFixed(1)}`);
    area.setAttribute('d', top.join(' ') + ' ' + bottom.join(' ') + ' Z');
    area.setAttribute('class', 'dlc-chart-band');
    svg.appendChild(area);
    const mean = document.createElementNS(SVG_NS, 'path');
    mean.setAttribute('d', band.rows.map(([x, m], k) => `${k ? 'L' : 'M'}${sx(x).toFixed(1)} ${sy(m).toFixed(1)}`).join(' '));
    mean.setAttribute('class', 'dlc-chart-line dlc-chart-mean');
    mean.setAttribute('stroke', '#000');
    svg.appendChild(mean);
    series = [{ label: `mean of ${band.of}`, points: [] }, ...series];
  }
  // muted series first, so that they lie under the others; colours count the others only
  series = [...series.filter(s => s.muted), ...series.filter(s => !s.muted)];
  const colour = (s: Series, i: number) => (s.muted ? MUTED : COLORS[(i - series.filter(m => m.muted).length) % COLORS.length]);
  series.forEach((s, i) => {
    if (!s.points.length) {
      return;
    }
    const path = document.createElementNS(SVG_NS, 'path');
    const d = s.points
      .map(([x, y], k) => `${k ? 'L' : 'M'}${sx(x).toFixed(1)} ${sy(y).toFixed(1)}`)
      .join(' ');
    path.setAttribute('d', d);
    path.setAttribute('class', s.muted ? 'dlc-chart-line dlc-chart-parent'
      : band ? 'dlc-chart-line dlc-chart-outlier' : 'dlc-chart-line');
    if (s.muted) {
      path.setAttribute('stroke-dasharray', '4 3');
    }
    // what the line reaches, for the browser test and benchmarks/live_view.py
    path.dataset.label = s.label;
    path.dataset.lastX = String(s.points[s.points.length - 1][0]);
    path.setAttribute('stroke', colour(s, i));
    const tip = document.createElementNS(SVG_NS, 'title');
    const last = s.points[s.points.length - 1];
    tip.textContent = `${s.label}: ${last ? fmt(last[1]) : ''}`;
    path.appendChild(tip);
    svg.appendChild(path);
  });
  // legend: first few series
  series.slice(0, 4).forEach((s, i) => {
    const t = document.createElementNS(SVG_NS, 'text');
    t.setAttribute('x', String(W - R - 2));
    t.setAttribute('y', String(T + 10 + i * 10));
    t.setAttribute('text-anchor', 'end');
    t.setAttribute('class', 'dlc-chart-legend');
    t.setAttribute('fill', colour(s, i));
    t.textContent = s.label;
    svg.appendChild(t);
  });
  return svg;
}
