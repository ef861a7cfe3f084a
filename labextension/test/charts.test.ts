import { MetricSeries, MetricPoint, lineChart, MAX_POINTS_PER_SERIES } from '../src/charts';

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
    expect(m.lastSeq).toBe(4);
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
