import { BandRow, BandSeries, JobMetrics, Metrics, PENDING_STEPS } from '../src/bands';
import { MAX_OUTLIERS, MetricPoint } from '../src/charts';

function row(step: number, values: number[], over: Partial<BandRow> = {}): BandRow {
  return {
    attempt: 1,
    name: 'loss',
    step,
    t: step,
    n: values.length,
    sum: values.reduce((a, b) => a + b, 0),
    lo: Math.min(...values),
    hi: Math.max(...values),
    outliers: [],
    ...over
  };
}

function pt(seq: number, over: Partial<MetricPoint>): MetricPoint {
  return { seq, t: seq, attempt: 1, rank: 0, node: 0, step: 1, kind: 'train', name: 'loss', value: 1, device: null, ...over };
}

function answer(lastSeq: number, bands: BandRow[] | null, points: MetricPoint[] = []): Metrics {
  return { points, last_seq: lastSeq, bands, downsampled: null };
}

describe('BandSeries: the launcher band rows added up', () => {
  it('gives a step split over rows of several answers the band of one row of all its values', () => {
    const values = [1, 2, 3, 100, 5, 6, 7, 8, 9, 10, -50, 12];
    const whole = new JobMetrics(12);
    const far = [{ rank: 3, value: 100 }, { rank: 10, value: -50 }];
    whole.take(answer(12, [row(1, values, { outliers: far })]), 0, whole.query());
    const split = new JobMetrics(12);
    split.take(answer(5, [row(1, values.slice(0, 5), { outliers: [far[0]] })]), 0, split.query());
    expect(split.chart('loss').band?.rows).toEqual([]); // waits for the other 7 ranks
    split.take(answer(9, [row(1, values.slice(5, 9))]), 5, split.query());
    split.take(answer(12, [row(1, values.slice(9), { outliers: [far[1]] })]), 9, split.query());
    expect(split.chart('loss')).toEqual(whole.chart('loss'));
    expect(whole.chart('loss').band).toEqual({ rows: [[1, 113 / 12, -50, 100]], of: 12 });
    expect(whole.band?.outliers).toEqual([3, 10]);
    expect(split.band?.outliers).toEqual([3, 10]);
  });

  it('draws a step partially once 64 newer steps of its metric wait (more than 64 pending)', () => {
    const band = new BandSeries(16);
    band.addRow(row(0, [5, 7])); // 14 ranks never report step 0
    for (let step = 1; step < PENDING_STEPS; step++) {
      band.addRow(row(step, [1, 1, 1])); // nor these
      band.addRow(row(step, [3], { name: 'acc' }));
    }
    expect(band.get('loss').band.rows).toEqual([]);
    band.addRow(row(PENDING_STEPS, [2]));
    expect(band.get('loss').band.rows).toEqual([[0, 6, 5, 7]]);
    expect(band.get('acc').band.rows).toEqual([]); // counted per metric
    band.addRow(row(PENDING_STEPS + 1, [2]));
    expect(band.get('loss').band.rows.map(r => r[0])).toEqual([0, 1]);
  });

  it('promotes the candidates of a step farthest from its mean, with their pending values', () => {
    const world = 10;
    const band = new BandSeries(world);
    const spread = (n: number) => Array.from({ length: n }, () => 1);
    // step 2 of loss and step 1 of acc wait for ranks; their candidates are at hand
    band.addRow(row(2, spread(4), { outliers: [{ rank: 5, value: 40 }] }));
    band.addRow(row(1, spread(4), { name: 'acc', outliers: [{ rank: 5, value: -3 }, { rank: 6, value: 9 }] }));
    band.addRow(row(0, spread(3), { outliers: [{ rank: 5, value: 50 }] })); // an earlier step: not drawn on the line
    // step 1 of loss completes: 5, 6, 7 and 8 stand out in it; 5 and 8 farthest
    band.addRow(
      row(1, [...spread(6), 30, -30, 20, 1.5], {
        outliers: [
          { rank: 6, value: 20 },
          { rank: 8, value: -30 },
          { rank: 5, value: 30 },
          { rank: 7, value: 1.5 }
        ]
      })
    );
    expect(band.outliers).toEqual([8, 5, 6]);
    expect(band.outliers.length).toBe(MAX_OUTLIERS);
    const loss = band.get('loss');
    expect(loss.outliers.map(s => s.label)).toEqual(['rank 8 (outlier)', 'rank 5 (outlier)', 'rank 6 (outlier)']);
    const line = (name: string, rank: number) =>
      band.get(name).outliers.find(s => s.label === `rank ${rank} (outlier)`)?.points;
    expect(line('loss', 5)).toEqual([[1, 30], [2, 40]]);
    expect(line('loss', 8)).toEqual([[1, -30]]);
    expect(line('acc', 5)).toEqual([[1, -3]]);
    expect(line('acc', 6)).toEqual([[1, 9]]);
    // a later candidate value of an outlier joins its line as its row comes
    band.addRow(row(3, spread(5), { outliers: [{ rank: 8, value: -31 }, { rank: 7, value: 2 }] }));
    expect(line('loss', 8)).toEqual([[1, -30], [3, -31]]);
    expect(line('loss', 7)).toBeUndefined();
  });

  it('counts an outlier rank\'s own points into the band and draws them on its line', () => {
    const band = new BandSeries(9);
    band.addRow(row(1, [1, 1, 1, 1, 1, 1, 1, 1, 100], { outliers: [{ rank: 8, value: 100 }] }));
    expect(band.outliers).toEqual([8]);
    // from now on the launcher sends rank 8 as points, and folds the other eight
    band.addRow(row(2, [1, 1, 1, 1, 1, 1, 1, 1]));
    expect(band.get('loss').band.rows.length).toBe(1);
    band.addPoint(pt(20, { rank: 8, step: 2, value: 91 }));
    expect(band.get('loss').band.rows).toEqual([[1, 108 / 9, 1, 100], [2, 99 / 9, 1, 91]]);
    expect(band.get('loss').outliers[0].points).toEqual([[1, 100], [2, 91]]);
    band.addPoint(pt(21, { rank: 8, step: 3, value: null })); // NaN: skipped, as the fold skips it
    expect(band.charts()).toEqual(['loss']);
  });

  it('cuts its lines where a later attempt resumes, and drops what an earlier one sends late', () => {
    const band = new BandSeries(9);
    const nine = [1, 1, 1, 1, 1, 1, 1, 1, 100];
    for (const step of [1, 2, 3, 4]) {
      band.addRow(row(step, nine, { outliers: [{ rank: 8, value: 100 }] }));
    }
    band.addRow(row(5, [1, 1])); // pending when the resume comes: dropped with it
    band.addRow(row(3, [2, 2, 2, 2, 2, 2, 2, 2, 2], { attempt: 2 }));
    band.addRow(row(4, [3, 3, 3, 3, 3, 3, 3, 3, 3], { attempt: 1 }));
    band.addRow(row(5, [2, 2, 2, 2, 2, 2, 2], { attempt: 2 }));
    expect(band.get('loss').band.rows.map(r => [r[0], r[1]])).toEqual([[1, 12], [2, 12], [3, 2]]);
    expect(band.get('loss').outliers[0].points).toEqual([[1, 100], [2, 100]]);
  });

  it('keeps its lines in step order when a step completes before an earlier one', () => {
    const band = new BandSeries(9);
    band.addRow(row(1, [1, 1]));
    band.addRow(row(2, [2, 2, 2, 2, 2, 2, 2, 2, 2]));
    band.addRow(row(1, [1, 1, 1, 1, 1, 1, 1]));
    expect(band.get('loss').band.rows.map(r => r[0])).toEqual([1, 2]);
  });

  it('reads the non-finite numbers the launcher writes as strings', () => {
    const band = new BandSeries(9);
    const wild = { ...row(1, [1]), n: 9, sum: 'inf', hi: 'inf' } as unknown as BandRow;
    band.addRow(wild);
    expect(band.get('loss').band.rows).toEqual([]); // a mean of inf cannot be drawn
    band.addRow(row(2, [1, 1, 1, 1, 1, 1, 1, 1, 1]));
    expect(band.get('loss').band.rows).toEqual([[2, 1, 1, 1]]);
  });
});

describe('JobMetrics: answers in order', () => {
  it('reads per rank up to 8 ranks, as before: points told apart by seq, the cursor at last_seq', () => {
    const m = new JobMetrics(8);
    expect(m.query()).toEqual({});
    expect(m.take(answer(5, null, [pt(4, { rank: 1 }), pt(5, { rank: 2 })]), 0, {}).values).toBe(2);
    expect(m.take(answer(5, null, [pt(5, { rank: 2 })]), 0, {}).values).toBe(0); // a poll that overlapped
    expect(m.take(answer(9, null, []), 5, {}).values).toBe(0);
    expect(m.lastSeq).toBe(9); // no point, yet the cursor follows the answer
    expect(m.chart('loss').series.map(s => s.label)).toEqual(['rank 1', 'rank 2']);
    expect(m.chart('loss').band).toBeUndefined();
  });

  it('past 8 ranks asks band=1 with its outliers, and applies an answer only where the last one ended', () => {
    const m = new JobMetrics(9);
    const q = m.query();
    expect(q).toEqual({ band: 1, ranks: '' });
    const nine = row(1, [1, 1, 1, 1, 1, 1, 1, 1, 100], { outliers: [{ rank: 8, value: 100 }] });
    // the stream's first page and a poll both read (0, 30]; the second one is not added again
    expect(m.take(answer(30, [nine], [pt(3, { kind: 'system', name: 'cpu_util', step: null, rank: null })]), 0, q))
      .toEqual({ values: 10, outOfStep: false });
    expect(m.take(answer(30, [nine]), 0, q)).toEqual({ values: 0, outOfStep: false });
    expect(m.lastSeq).toBe(30);
    expect(m.chart('loss').band?.rows).toEqual([[1, 108 / 9, 1, 100]]);
    expect(m.charts().sort()).toEqual(['cpu_util', 'loss']);
    expect(m.chart('cpu_util').series.length).toBe(1);
    // rank 8 stood out: from now on it is asked for as points
    expect(m.query()).toEqual({ band: 1, ranks: '8' });
    // a read that overlaps what was applied, or one asked without rank 8, is read again
    expect(m.take(answer(40, [row(2, [1, 1, 1, 1, 1, 1, 1, 1, 1])]), 20, { band: 1, ranks: '8' }))
      .toEqual({ values: 0, outOfStep: true });
    expect(m.take(answer(40, [row(2, [1, 1, 1, 1, 1, 1, 1, 1, 1])]), 30, q)).toEqual({ values: 0, outOfStep: true });
    expect(m.lastSeq).toBe(30);
    expect(m.chart('loss').band?.rows.length).toBe(1);
    const next = answer(40, [row(2, [1, 1, 1, 1, 1, 1, 1, 1])], [pt(35, { rank: 8, step: 2, value: 50 })]);
    expect(m.take(next, 30, m.query())).toEqual({ values: 9, outOfStep: false });
    expect(m.chart('loss').band?.rows[1]).toEqual([2, 58 / 9, 1, 50]);
    expect(m.chart('loss').series).toEqual([{ label: 'rank 8 (outlier)', points: [[1, 100], [2, 50]] }]);
  });

  it('applies the points and rows of an answer attempt by attempt', () => {
    const m = new JobMetrics(9);
    const eight = [1, 1, 1, 1, 1, 1, 1, 1];
    m.take(answer(10, [row(1, [...eight, 100], { outliers: [{ rank: 8, value: 100 }] })]), 0, m.query());
    // in seq order: attempt 1 logs step 2 (rank 8 as a point), then attempt 2 resumes at step 3
    const resumed = answer(
      30,
      [row(2, eight, { attempt: 1 }), row(3, eight, { attempt: 2 })],
      [pt(11, { rank: 8, step: 2, value: 90, attempt: 1 }), pt(21, { rank: 8, step: 3, value: 80, attempt: 2 })]
    );
    expect(m.take(resumed, 10, m.query()).values).toBe(18);
    expect(m.chart('loss').band?.rows).toEqual([[1, 108 / 9, 1, 100], [2, 98 / 9, 1, 90], [3, 88 / 9, 1, 80]]);
    expect(m.chart('loss').series[0].points).toEqual([[1, 100], [2, 90], [3, 80]]);
  });
});
