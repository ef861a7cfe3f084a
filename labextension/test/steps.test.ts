/**
 * The detail's "where each step goes" chart (src/steps.ts): metric rows -> stacked parts, per
 * rank up to 8 ranks (the median over ranks), past 8 from the launcher's band rows (the mean).
 */
import { BandRow, JobMetrics, Metrics } from '../src/bands';
import { MetricPoint } from '../src/charts';
import { STEPS_SHOWN, stepChart, stepRows, stepsTitle } from '../src/steps';

let seq = 0;
function pt(rank: number, step: number, name: string, value: number): MetricPoint {
  seq += 1;
  return { seq, t: step, attempt: 1, rank, node: 0, step, kind: 'train', name, value, device: null };
}

function answer(points: MetricPoint[], bands: BandRow[] | null = null): Metrics {
  return { points, last_seq: seq, bands, downsampled: null };
}

/** One rank's breakdown of one step, as the runtime logs it. */
function logged(rank: number, step: number, stepMs: number, data: number, sync: number, ckpt: number): MetricPoint[] {
  return [
    pt(rank, step, 'loss', 1 / step),
    pt(rank, step, 'step_ms', stepMs),
    pt(rank, step, 'data_wait_ms', data),
    pt(rank, step, 'grad_sync_ms', sync),
    pt(rank, step, 'ckpt_stall_ms', ckpt)
  ];
}

describe('stepRows: where each step goes', () => {
  it('is empty until a rank logs the breakdown', () => {
    const m = new JobMetrics(2);
    m.take(answer([pt(0, 1, 'loss', 1), pt(1, 1, 'loss', 2)]), 0, m.query());
    expect(stepRows(name => m.chart(name))).toEqual([]);
  });

  it('stacks each part as the median over ranks, compute being the step less the three', () => {
    const m = new JobMetrics(3);
    m.take(
      answer([
        ...logged(0, 1, 80, 1, 30, 0),
        ...logged(1, 1, 80, 31, 0, 0), // the slow rank: its own work, nobody to wait for
        ...logged(2, 1, 80, 2, 28, 0),
        ...logged(0, 2, 100, 1, 10, 50),
        ...logged(1, 2, 100, 1, 10, 50),
        // rank 2 logs step 2 without its parts: they count 0, compute is the whole step
        pt(2, 2, 'step_ms', 40)
      ]),
      0,
      m.query()
    );
    expect(stepRows(name => m.chart(name))).toEqual([
      // data [1, 31, 2] -> 2; sync [30, 0, 28] -> 28; ckpt 0; compute [49, 49, 50] -> 49
      { step: 1, data: 2, sync: 28, ckpt: 0, compute: 49 },
      // data [1, 1, 0] -> 1; sync [10, 10, 0] -> 10; ckpt [50, 50, 0] -> 50; compute [39, 39, 40]
      { step: 2, data: 1, sync: 10, ckpt: 50, compute: 39 }
    ]);
  });

  it('takes the median of an even count as the mean of the middle two, and never a negative compute', () => {
    const m = new JobMetrics(2);
    m.take(answer([...logged(0, 5, 10, 4, 8, 0), ...logged(1, 5, 20, 2, 2, 0)]), 0, m.query());
    // rank 0's parts exceed its step: compute 0 (not -2); rank 1's compute 16
    expect(stepRows(name => m.chart(name))).toEqual([{ step: 5, data: 3, sync: 5, ckpt: 0, compute: 8 }]);
  });

  it('keeps the last 200 steps', () => {
    const m = new JobMetrics(1);
    const points: MetricPoint[] = [];
    for (let step = 1; step <= 500; step++) {
      points.push(...logged(0, step, 10, 1, 2, 3));
    }
    m.take(answer(points), 0, m.query());
    const rows = stepRows(name => m.chart(name));
    expect(rows.length).toBe(STEPS_SHOWN);
    expect(rows[0]).toEqual({ step: 301, data: 1, sync: 2, ckpt: 3, compute: 4 });
    expect(rows[rows.length - 1].step).toBe(500);
  });

  it('past 8 ranks uses the band means of the launcher rows', () => {
    const world = 16;
    const m = new JobMetrics(world);
    const row = (name: string, step: number, values: number[]): BandRow => ({
      attempt: 1, name, step, t: step, n: values.length, sum: values.reduce((a, b) => a + b, 0),
      lo: Math.min(...values), hi: Math.max(...values), outliers: []
    });
    const of = (v: number) => Array.from({ length: world }, (_, i) => v + (i % 2 ? 1 : -1));
    const rows = [
      row('step_ms', 7, of(60)),
      row('data_wait_ms', 7, of(5)),
      row('grad_sync_ms', 7, of(20)),
      row('ckpt_stall_ms', 7, Array(world).fill(0))
    ];
    m.take(answer([], rows), 0, m.query());
    expect(stepRows(name => m.chart(name))).toEqual([{ step: 7, data: 5, sync: 20, ckpt: 0, compute: 35 }]);
    expect(stepsTitle(true, world)).toBe('where each step goes (mean of 16 ranks)');
  });
});

describe('stepChart', () => {
  it('draws one bar a step with a rect a part that took time, bottom up', () => {
    const svg = stepChart(stepsTitle(false, 4), [
      { step: 1, data: 2, sync: 28, ckpt: 0, compute: 50 },
      { step: 2, data: 1, sync: 10, ckpt: 50, compute: 39 }
    ]);
    expect(svg.dataset.chart).toBe('steps');
    expect(svg.querySelector('.dlc-chart-title')!.textContent).toBe('where each step goes (median of the ranks)');
    const bars = Array.from(svg.querySelectorAll<SVGGElement>('g.dlc-step-bar'));
    expect(bars.map(b => b.dataset.step)).toEqual(['1', '2']);
    const parts = (b: SVGGElement) => Array.from(b.querySelectorAll<SVGRectElement>('rect')).map(r => r.dataset.part);
    expect(parts(bars[0])).toEqual(['data', 'sync', 'compute']);
    expect(parts(bars[1])).toEqual(['data', 'sync', 'ckpt', 'compute']);
    // the tallest step fills the frame: 100 ms of 108 px (140 - 16 - 16)
    const heights = Array.from(bars[1].querySelectorAll('rect')).map(r => Number(r.getAttribute('height')));
    expect(heights.reduce((a, b) => a + b, 0)).toBeCloseTo(108, 1);
    expect(bars[0].querySelector('title')!.textContent).toContain('gradient sync 28.0 ms');
  });
});
