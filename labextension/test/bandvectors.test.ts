/**
 * Band folding, specified once: tests/vectors/bands.json (read by tests/test_band_vectors.py
 * for the notebook view too). The panel's BandSeries draws exactly the band points and
 * outlier lines each case expects from the launcher's rows and points.
 */
import * as fs from 'fs';
import * as path from 'path';

import { BandRow, BandSeries } from '../src/bands';
import { MetricPoint } from '../src/charts';

interface Case {
  name: string;
  world_size: number;
  inputs: ({ row: BandRow } | { point: MetricPoint })[];
  expect: Record<string, { band: number[][]; outliers: Record<string, number[][]> }>;
  outliers: number[];
}

const VECTORS = path.join(__dirname, '..', '..', 'tests', 'vectors', 'bands.json');
const cases: Case[] = JSON.parse(fs.readFileSync(VECTORS, 'utf8')).cases;

describe('band vectors', () => {
  it.each(cases.map(c => [c.name, c] as const))('%s', (_name, c) => {
    const series = new BandSeries(c.world_size);
    for (const item of c.inputs) {
      if ('row' in item) {
        series.addRow(item.row);
      } else {
        series.addPoint(item.point);
      }
    }
    const drawn: Case['expect'] = {};
    for (const name of series.charts()) {
      const { band, outliers } = series.get(name);
      const lines: Record<string, number[][]> = {};
      for (const line of outliers) {
        lines[line.label.split(' ')[1]] = line.points.map(p => [...p]);
      }
      if (band.rows.length || Object.keys(lines).length) {
        drawn[name] = { band: band.rows.map(r => [...r]), outliers: lines };
      }
    }
    expect(Object.keys(drawn).sort()).toEqual(Object.keys(c.expect).sort());
    for (const [name, want] of Object.entries(c.expect)) {
      expect(drawn[name].band.length).toBe(want.band.length);
      drawn[name].band.forEach((r, i) => r.forEach((v, j) => expect(v).toBeCloseTo(want.band[i][j], 9)));
      expect(drawn[name].outliers).toEqual(want.outliers);
    }
    expect(series.outliers).toEqual(c.outliers);
  });
});
