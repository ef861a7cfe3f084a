import { branchCell, ownCell } from '../src/branch';
import { JobSummary } from '../src/store';

function job(over: Partial<JobSummary> = {}): JobSummary {
  return {
    id: 'train-3f2a1c', name: 'train', state: 'SUCCEEDED', attempt: 1, nodes: 2, nproc_per_node: 4,
    created: 1000, started: null, ended: null, reason: null, last_step: 40, last_loss: 0.1,
    engine: 'local', source: {}, job_dir: '/data/jobs/train-3f2a1c', stop_requested: null, storage: null,
    ...over
  };
}

// captured definitions from cell 3 (script lines 2-3), then the %%dlc cell 5 (lines 5-7)
const SCRIPT = '# captured\nLR = 0.1\nWIDTH = 8\n# the cell\nmodel = make(WIDTH)\nfor step in range(10):\n    train(LR)\n';

describe('branch from here', () => {
  it('takes the lines of the job\'s own cell from its source map', () => {
    // the recorded source also has the cell and its line map (the schema names kind and path only)
    const source = { kind: 'notebook', path: '/home/me/nb.ipynb', cell: 5, lines: [[2, 3, 1, 2], [5, 5, 2, 3]] };
    const j = job({ source: source as JobSummary['source'] });
    expect(ownCell(j, SCRIPT)).toBe('model = make(WIDTH)\nfor step in range(10):\n    train(LR)');
    expect(branchCell(j, SCRIPT, 20)).toBe(
      '%%dlc --nodes 2 --nproc-per-node 4 --from train-3f2a1c@20\nmodel = make(WIDTH)\nfor step in range(10):\n    train(LR)');
  });

  it('takes the whole script of a job without a source map (the CLI)', () => {
    const j = job({ source: { kind: 'cli', path: '/home/me/train.py' } });
    expect(ownCell(j, 'a = 1\nb = 2\n')).toBe('a = 1\nb = 2');
  });
});
