/**
 * Train metrics of a job past MAX_RANK_LINES ranks, drawn from the launcher's band rows, and
 * the cursor over a job's metric answers. No DOM, no JupyterLab (jest-tested).
 *
 * Past 8 ranks the panel reads with `band=1&ranks=<its outlier ranks>`: the launcher folds the
 * train points it reads into one row per (attempt, name, step) with count, sum, min, max and
 * the ranks that stand out among those values (jupyter_dlc/bands.py), and sends as points only
 * the outlier ranks' train points. A step whose points were stored across several reads comes
 * as several rows, possibly across answers; they add up here, as in the notebook view
 * (jupyter_dlc/widgets/series.py TrainData), by the same rules:
 * - a step is drawn once every rank is in it, or partially once PENDING_STEPS newer steps of
 *   its metric wait too (a rank that stopped logging);
 * - at that point its outlier candidates, farthest from the mean first, become outliers while
 *   fewer than MAX_OUTLIERS are; an outlier's line starts there, with its candidate values of
 *   the steps still pending, and takes its points (and candidate values) from then on;
 * - a row or point of a later attempt cuts every line from its first step (a resume re-does
 *   those steps); those of an earlier attempt are stragglers and dropped.
 */
import { Band, MAX_OUTLIERS, MAX_RANK_LINES, MetricPoint, MetricSeries, Series, entry, thin } from './charts';
import { components } from './wire';

export type BandRow = components['schemas']['BandRow'];
export type Metrics = components['schemas']['Metrics'];

/** steps waiting for their last rank before a partial band is drawn (as the notebook's) */
export const PENDING_STEPS = 64;

/** One step's band so far: what rows and kept ranks' points added up. */
interface Pending {
  n: number;
  sum: number;
  lo: number;
  hi: number;
  /** ranks named as standing out in the rows, with their value */
  candidates: Map<number, number>;
}

/** A number of the wire: the launcher writes a non-finite one as a string ("inf", "nan"). */
function num(v: unknown): number {
  if (typeof v === 'number') {
    return v;
  }
  return v === 'inf' ? Infinity : v === '-inf' ? -Infinity : NaN;
}

/** Put `item` (x first) into a bounded line kept in x order (a step may be emitted after a
 * later one: the later one had all its ranks first). */
function insert<T extends number[]>(pts: T[], item: T): void {
  let i = pts.length;
  while (i > 0 && pts[i - 1][0] > item[0]) {
    i--;
  }
  pts.splice(i, 0, item);
  thin(pts);
}

/** Drop the points at x >= `x` (a resumed attempt re-does those steps). */
function cutFrom(pts: number[][], x: number): void {
  const first = pts.findIndex(p => p[0] >= x);
  if (first >= 0) {
    pts.length = first;
  }
}

export class BandSeries {
  /** ranks with a line of their own, in the order found */
  readonly outliers: number[] = [];
  private attempt = 0;
  private pending = new Map<string, Map<number, Pending>>();
  /** per metric, the highest step drawn: a later value of a step up to it that is not still
   * pending is dropped (it would draw the step again from that value alone, as the notebook
   * view's TrainData does: tests/vectors/bands.json) */
  private drawnThrough = new Map<string, number>();
  private bands = new Map<string, [number, number, number, number][]>();
  private lines = new Map<string, Map<number, [number, number][]>>();

  constructor(readonly worldSize: number) {}

  /** A band row of the launcher: this step's values it read, added up. */
  addRow(row: BandRow): void {
    if (!this.current(row.attempt ?? 1, row.step)) {
      return;
    }
    const pending = this.merge(row.name, row.step, row.n, num(row.sum), num(row.lo), num(row.hi));
    for (const { rank, value } of row.outliers) {
      if (this.outliers.includes(rank)) {
        this.appendTo(row.name, rank, row.step, num(value));
      } else if (pending) {
        pending.candidates.set(rank, num(value));
      }
    }
    if (pending) {
      this.settle(row.name, row.step);
    }
  }

  /** A train point: the launcher left its rank out of the rows (an outlier's), so it is one
   * value of its step's band, and a point of the rank's line when that rank is an outlier. */
  addPoint(p: MetricPoint): void {
    const { step, rank } = p;
    const value = num(p.value);
    if (step === null || step === undefined || rank === null || rank === undefined || isNaN(value)) {
      return; // not drawn (NaN is stored as null), as the launcher's fold skips it
    }
    if (!this.current(p.attempt ?? 1, step)) {
      return;
    }
    if (this.outliers.includes(rank)) {
      this.appendTo(p.name, rank, step, value);
    }
    if (this.merge(p.name, step, 1, value, value, value)) {
      this.settle(p.name, step);
    }
  }

  /** The metrics that have something drawn or on the way. */
  charts(): string[] {
    return [...new Set([...this.bands.keys(), ...this.pending.keys(), ...this.lines.keys()])];
  }

  /** What `lineChart` draws of metric `name`: its band and its outliers' lines. */
  get(name: string): { band: Band; outliers: Series[] } {
    const lines = this.lines.get(name);
    return {
      band: { rows: this.bands.get(name) ?? [], of: this.worldSize },
      outliers: this.outliers
        .filter(rank => lines?.has(rank))
        .map(rank => ({ label: `rank ${rank} (outlier)`, points: lines!.get(rank)! }))
    };
  }

  /** Whether a row or point of `attempt` belongs to the chart (a later attempt resumes). */
  private current(attempt: number, step: number): boolean {
    if (attempt > this.attempt) {
      if (this.attempt) {
        this.newAttempt(step);
      }
      this.attempt = attempt;
    }
    return attempt === this.attempt;
  }

  private newAttempt(firstStep: number): void {
    for (const rows of this.bands.values()) {
      cutFrom(rows, firstStep);
    }
    for (const byRank of this.lines.values()) {
      for (const pts of byRank.values()) {
        cutFrom(pts, firstStep);
      }
    }
    this.pending.clear();
    this.drawnThrough.clear();
  }

  /** Add values to the band of (`name`, `step`) on the way; returns it, or null for a step
   * already drawn. */
  private merge(name: string, step: number, n: number, sum: number, lo: number, hi: number): Pending | null {
    const steps = entry(this.pending, name, () => new Map());
    if (!steps.has(step) && step <= (this.drawnThrough.get(name) ?? -Infinity)) {
      return null;
    }
    const at = entry(steps, step, () => ({ n: 0, sum: 0, lo: Infinity, hi: -Infinity, candidates: new Map() }));
    at.n += n;
    at.sum += sum;
    at.lo = Math.min(at.lo, lo);
    at.hi = Math.max(at.hi, hi);
    return at;
  }

  private appendTo(name: string, rank: number, step: number, value: number): void {
    if (!isFinite(value)) {
      return; // a line skips what it cannot draw, as MetricSeries does
    }
    insert(entry(entry(this.lines, name, () => new Map()), rank, () => []), [step, value]);
  }

  /** Emit `step` once every rank is in it; the oldest steps once too many wait. */
  private settle(name: string, step: number): void {
    const steps = this.pending.get(name)!;
    const at = steps.get(step)!;
    if (at.n >= this.worldSize) {
      steps.delete(step);
      this.emit(name, step, at);
    }
    if (steps.size > PENDING_STEPS) {
      const old = [...steps.keys()].sort((a, b) => a - b).slice(0, steps.size - PENDING_STEPS);
      for (const s of old) {
        const partial = steps.get(s)!;
        steps.delete(s);
        this.emit(name, s, partial);
      }
    }
  }

  private emit(name: string, step: number, at: Pending): void {
    this.drawnThrough.set(name, Math.max(step, this.drawnThrough.get(name) ?? step));
    const mean = at.sum / at.n;
    if (isFinite(mean) && isFinite(at.lo) && isFinite(at.hi)) {
      insert(entry(this.bands, name, () => []), [step, mean, at.lo, at.hi]);
    }
    const far = [...at.candidates].sort((a, b) => Math.abs(b[1] - mean) - Math.abs(a[1] - mean));
    for (const [rank, value] of far) {
      if (this.outliers.length >= MAX_OUTLIERS) {
        break;
      }
      if (!this.outliers.includes(rank)) {
        this.promote(rank, name, step, value);
      }
    }
  }

  /** Give `rank` a line of its own, starting with what is at hand: this step and its
   * candidate values of the steps still pending (its later values are added as they come). */
  private promote(rank: number, name: string, step: number, value: number): void {
    this.outliers.push(rank);
    this.appendTo(name, rank, step, value);
    for (const [other, steps] of this.pending) {
      for (const s of [...steps.keys()].sort((a, b) => a - b)) {
        const candidate = steps.get(s)!.candidates.get(rank);
        if (candidate !== undefined && (other !== name || s > step)) {
          this.appendTo(other, rank, s, candidate);
          steps.get(s)!.candidates.delete(rank);
        }
      }
    }
  }
}

/** The query of a metrics read: past MAX_RANK_LINES ranks, `band=1` and the outlier ranks. */
export interface MetricsQuery {
  band?: 1;
  ranks?: string;
}

/** How a metrics answer was taken: `values` applied (points, and values folded in rows);
 * `outOfStep` when it was not applied though it held values not yet applied (read again from
 * `lastSeq`, with the current query). */
export interface Taken {
  values: number;
  outOfStep: boolean;
}

/**
 * A job's metrics as the detail tab draws them, and the seq of the last answer applied: the
 * next read (stream or poll) asks `since` that seq, with `query()`.
 */
export class JobMetrics {
  lastSeq = 0;
  /** system metrics; train metrics too up to MAX_RANK_LINES ranks */
  readonly series = new MetricSeries();
  /** train metrics past MAX_RANK_LINES ranks */
  readonly band: BandSeries | null;

  constructor(worldSize: number) {
    this.band = worldSize > MAX_RANK_LINES ? new BandSeries(worldSize) : null;
  }

  query(): MetricsQuery {
    return this.band ? { band: 1, ranks: this.band.outliers.join(',') } : {};
  }

  /**
   * An answer read after `since` with `query`. Points are told apart by seq, so one line per
   * rank takes what it has not seen. Rows are not: a poll and the stream that read the same
   * span would add its rows twice, so a band answer applies only when it starts where the
   * last applied one ended, and was asked with the outlier ranks of now (else the new
   * outliers' points would be folded into its rows, not sent).
   */
  take(answer: Metrics, since: number, query: MetricsQuery): Taken {
    const band = this.band;
    if (!band) {
      const fresh = answer.points.filter(p => p.seq > this.lastSeq);
      this.series.add(fresh);
      this.lastSeq = Math.max(this.lastSeq, answer.last_seq);
      return { values: fresh.length, outOfStep: false };
    }
    if (since !== this.lastSeq || query.ranks !== this.query().ranks) {
      return { values: 0, outOfStep: answer.last_seq > this.lastSeq };
    }
    const rows = answer.bands ?? [];
    // attempt by attempt (a stable sort), so that a resume cuts what came before it only
    const train: [number, () => void][] = [
      ...rows.map((row): [number, () => void] => [row.attempt ?? 1, () => band.addRow(row)]),
      ...answer.points
        .filter(p => p.kind === 'train')
        .map((p): [number, () => void] => [p.attempt ?? 1, () => band.addPoint(p)])
    ];
    train.sort((a, b) => a[0] - b[0]);
    for (const [, add] of train) {
      add();
    }
    this.series.add(answer.points.filter(p => p.kind !== 'train'));
    this.lastSeq = Math.max(this.lastSeq, answer.last_seq);
    return { values: answer.points.length + rows.reduce((n, row) => n + row.n, 0), outOfStep: false };
  }

  /** The metric names to chart. */
  charts(): string[] {
    return [...new Set([...(this.band?.charts() ?? []), ...this.series.charts()])];
  }

  /** What `lineChart` draws of metric `name`: its series, or past 8 ranks a band with its
   * outliers' lines. */
  chart(name: string): { series: Series[]; band?: Band } {
    const folded = this.band?.charts().includes(name) ? this.band.get(name) : null;
    return folded ? { series: folded.outliers, band: folded.band } : { series: this.series.get(name) };
  }
}
