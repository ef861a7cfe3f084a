import { downsampledNote } from '../src/metricsfeed';
import { MetricSeries, MetricPoint, lineChart, MAX_POINTS_PER_SERIES, MAX_OUTLIERS, bandOf, outliersAt } from '../src/charts';

function pt(seq: number, over: Partial<MetricPoint>): MetricPoint {
  return { seq, t: seq, attempt: 1, rank: 0, node: 0, step: seq, kind: 'train', name: 'loss', value: 1, device: null, ...over };
}

describe('MetricSeries', () => {
  it('groups train metrics by rank against step and system metrics by node/device against time', () => {
    const m = new MetricSeries();
    m.add([
      pt(1, { rank: 0, value: 2 }),
      pt(2, { rank: 1, value: 3 }),
      pt(3, { kind: 'system', name: 'cpu_util', device: 'cpu', step: null, t: 100, value: 0.5 }),
      pt(4, { rank: 0, value: NaN })
    ]);
    expect(m.charts().sort()).toEqual(['cpu_util', 'loss']);
    expect(m.get('loss').map(s => s.label)).toEqual(['rank 0', 'rank 1']);
    expect(m.get('cpu_util')[0]).toEqual({ label: 'node 0 cpu', points: [[100, 0.5]] });
  });

  it('bounds memory per series', () => {
    const m = new MetricSeries();
    const pts: MetricPoint[] = [];
    for (let i = 1; i <= 10000; i++) {
      pts.push(pt(i, { value: i }));
    }
    m.add(pts);
    const s = m.get('loss')[0].points;
    expect(s.length).toBeLessThanOrEqual(MAX_POINTS_PER_SERIES);
    expect(s[s.length - 1]).toEqual([10000, 10000]);
    expect(s[0]).toEqual([1, 1]);
  });
});

describe('lineChart', () => {
  it('draws one path per series and says when there is no data', () => {
    const svg = lineChart('loss', [
      { label: 'rank 0', points: [[0, 1], [1, 0.5]] },
      { label: 'rank 1', points: [[0, 2], [1, 0.7]] }
    ]);
    expect(svg.querySelectorAll('path.dlc-chart-line').length).toBe(2);
    expect(svg.dataset.chart).toBe('loss');
    expect(lineChart('gpu_util', []).textContent).toContain('no data yet');
  });
});

describe('bandOf (system metrics of many nodes) and the band chart', () => {
  const ranks = (n: number, at: (rank: number, step: number) => number) =>
    Array.from({ length: n }, (_, r) => ({
      label: `rank ${r}`,
      points: [1, 2, 3, 4].map((x): [number, number] => [x, at(r, x)])
    }));

  it('gives mean, min and max per step and picks the ranks that stand out', () => {
    const series = ranks(4096, (r, x) => 1 / x + (r % 5) * 1e-3 + (r === 77 && x >= 3 ? 10 : 0) + (r === 9 && x === 2 ? -5 : 0));
    const { band, outliers } = bandOf(series);
    expect(band.of).toBe(4096);
    expect(band.rows.map(r => r[0])).toEqual([1, 2, 3, 4]);
    const [, mean, lo, hi] = band.rows[2];
    expect(hi).toBeCloseTo(1 / 3 + 10 + 0.001 * (77 % 5));
    expect(lo).toBeCloseTo(1 / 3);
    expect(mean).toBeGreaterThan(1 / 3);
    expect(outliers.map(s => s.label).sort()).toEqual(['rank 77 (outlier)', 'rank 9 (outlier)']);
  });

  it('finds no outlier in an even spread, and every differing rank when the rest agree', () => {
    expect(outliersAt(new Map(Array.from({ length: 10 }, (_, i): [string, number] => [`r${i}`, i])))).toEqual([]);
    expect(outliersAt(new Map([['a', 1], ['b', 1], ['c', 1], ['d', 2]])).map(o => o.label)).toEqual(['d']);
  });

  it('draws a band, a mean and at most MAX_OUTLIERS outlier lines instead of one line per rank', () => {
    const svg = lineChart('loss', ranks(64, (r, x) => x + (r < 5 ? 100 * (r + 1) : 0)), { xLabel: 'step' });
    expect(svg.querySelectorAll('path.dlc-chart-band').length).toBe(1);
    expect(svg.querySelectorAll('path.dlc-chart-mean').length).toBe(1);
    expect(svg.querySelectorAll('path.dlc-chart-outlier').length).toBe(MAX_OUTLIERS);
    const few = lineChart('loss', ranks(8, (r, x) => x + r));
    expect(few.querySelectorAll('path.dlc-chart-band').length).toBe(0);
    expect(few.querySelectorAll('path.dlc-chart-line').length).toBe(8);
  });

  it('draws a given band (the launcher folded it) with its outlier lines, scaled to both', () => {
    const band = { rows: [[1, 2, 1, 3], [2, 1.5, 1, 2]] as [number, number, number, number][], of: 4096 };
    const svg = lineChart('loss', [{ label: 'rank 7 (outlier)', points: [[2, 40]] }], { band });
    expect(svg.querySelectorAll('path.dlc-chart-band').length).toBe(1);
    expect(svg.querySelectorAll('path.dlc-chart-mean').length).toBe(1);
    const outlier = svg.querySelector('path.dlc-chart-outlier') as SVGPathElement;
    expect(outlier.dataset.label).toBe('rank 7 (outlier)');
    expect(outlier.dataset.lastX).toBe('2');
    expect(svg.querySelector('text.dlc-chart-legend')?.textContent).toBe('mean of 4096');
    expect([...svg.querySelectorAll('text.dlc-chart-text')].map(t => t.textContent)).toContain('40.00');
    const empty = lineChart('loss', [], { band: { rows: [], of: 4096 } });
    expect(empty.textContent).toContain('no data yet');
  });
});

describe('downsampledNote', () => {
  it('says nothing while every point is as logged, and when and how coarsely after', () => {
    expect(downsampledNote(null)).toBe('');
    const note = downsampledNote({ until: 1700000000, bucket_seconds: 5, dropped: 12345, keep_last: 1000 });
    expect(note).toContain('downsampled (min, max and last of every 5 s');
    expect(note).toContain((12345).toLocaleString());
  });
});

describe('a branch parent in the chart', () => {
  it('is drawn first, dashed and grey, and leaves the ranks their colours', () => {
    const svg = lineChart('loss', [
      { label: 'rank 0', points: [[11, 0.5], [12, 0.4]] },
      { label: 'parent p to step 10', points: [[1, 2], [10, 0.6]], muted: true }
    ]);
    const paths = Array.from(svg.querySelectorAll('path.dlc-chart-line'));
    expect(paths.map(p => p.getAttribute('data-label'))).toEqual(['parent p to step 10', 'rank 0']);
    expect(paths[0].getAttribute('class')).toContain('dlc-chart-parent');
    expect(paths[0].getAttribute('stroke-dasharray')).toBe('4 3');
    expect(paths[0].getAttribute('stroke')).toBe('#b0bec5');
    expect(paths[1].getAttribute('stroke')).toBe('#1f77b4');
  });
});
