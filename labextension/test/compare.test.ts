import { curves, differences, lineDiff, valueText } from '../src/compare';

describe('compare', () => {
  it('draws rank 0 of one metric by step and by time since submit', () => {
    const points = [
      { rank: 1, name: 'loss', step: 1, t: 101, value: 9 },
      { rank: 0, name: 'loss', step: 2, t: 102, value: 0.5 },
      { rank: 0, name: 'loss', step: 1, t: 101, value: 1 },
      { rank: 0, name: 'lr', step: 1, t: 101, value: 0.1 },
      { rank: 0, name: 'loss', step: 3, t: 103, value: 'nan' }
    ];
    expect(curves(points, 'loss', 100)).toEqual({ byStep: [[1, 1], [2, 0.5]], byTime: [[1, 1], [2, 0.5]] });
  });

  it('lists the fields that differ, env and params a row a name, not the code or the name', () => {
    const a = { name: 'a', code: 'x', nodes: 2, env: { LR: '1', SAME: 'y' }, args: ['--a', '1'], branch_from: null };
    const b = { name: 'b', code: 'y', nodes: 2, env: { SAME: 'y' }, args: ['--a', '2'], branch_from: 'p@3', params: { lr: 0.1 } };
    expect(differences([a, b])).toEqual([
      { field: 'env.LR', values: ['1', undefined] },
      { field: 'args', values: ['--a 1', '--a 2'] },
      { field: 'branch_from', values: [null, 'p@3'] },
      { field: 'params.lr', values: [undefined, 0.1] }
    ]);
  });

  it('diffs the code line by line, with unchanged runs cut', () => {
    const a = ['import torch', 'a = 1', 'b = 2', 'c = 3', 'd = 4', 'e = 5', 'lr = 0.1', 'train(lr)'].join('\n');
    const b = ['import torch', 'a = 1', 'b = 2', 'c = 3', 'd = 4', 'e = 5', 'lr = 0.01', 'train(lr)', 'save()'].join('\n');
    expect(lineDiff(a, b)).toEqual([
      { op: ' ', text: '… 4 unchanged lines' },
      { op: ' ', text: 'd = 4' }, { op: ' ', text: 'e = 5' },
      { op: '-', text: 'lr = 0.1' }, { op: '+', text: 'lr = 0.01' },
      { op: ' ', text: 'train(lr)' },
      { op: '+', text: 'save()' }
    ]);
    expect(lineDiff(a, a)).toEqual([]);
    expect(valueText(0.123456)).toBe('0.1235');
    expect(valueText(undefined)).toBe('-');
  });
});
