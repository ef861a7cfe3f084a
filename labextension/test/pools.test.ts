/**
 * The side panel's pool list, fed the REAL `GET /api/pools` payload captured from a launcher
 * by tests/test_openapi.py. The source below stands in for the Jupyter server's proxy (no
 * launcher runs inside jest); it records what the view asks for.
 */
import * as fs from 'fs';
import * as path from 'path';

import { PoolSource, PoolsView, poolLine } from '../src/pools';
import { Schemas } from '../src/store';

const fx = JSON.parse(
  fs.readFileSync(path.join(__dirname, 'fixtures', 'launcher.json'), 'utf8')
) as { pools: Schemas['Pools'] };

class RecordingSource implements PoolSource {
  calls: string[] = [];
  constructor(private pools: Schemas['Pool'][]) {}
  async request<T>(method: string, p: string): Promise<T> {
    this.calls.push(`${method} ${p}`);
    if (method === 'DELETE') {
      const id = decodeURIComponent(p.split('/').pop()!);
      this.pools = this.pools.filter(x => x.id !== id);
      return { released: [id] } as T;
    }
    return { pools: this.pools } as T;
  }
}

describe('PoolsView', () => {
  it('lists the real payload with a Release button per pool', async () => {
    expect(fx.pools.pools.length).toBeGreaterThan(0);
    const view = new PoolsView(new RecordingSource(fx.pools.pools));
    await view.refresh();
    const rows = Array.from(view.node.querySelectorAll<HTMLElement>('.dlc-pool'));
    expect(rows.map(r => r.dataset.poolId)).toEqual(fx.pools.pools.map(p => p.id));
    expect(rows[0].textContent).toContain(poolLine(fx.pools.pools[0]));
    expect(rows[0].querySelector('button')!.textContent).toBe('Release');
    expect(view.node.hidden).toBe(false);
  });

  it('Release deletes that pool and the list follows; no pools hides the section', async () => {
    const source = new RecordingSource(fx.pools.pools);
    const view = new PoolsView(source);
    await view.refresh();
    const id = fx.pools.pools[0].id;
    await view.release(id);
    expect(source.calls).toContain(`DELETE api/pools/${id}`);
    expect(view.node.querySelector(`[data-pool-id="${id}"]`)).toBeNull();
    expect(view.node.hidden).toBe(fx.pools.pools.length === 1);
  });

  it('says what a busy pool serves and the node-hours it holds', () => {
    const busy = { ...fx.pools.pools[0], state: 'busy' as const, job: 'train-1a2b3c', node_hours: 1.234 };
    expect(poolLine(busy)).toBe(`${busy.id}: busy with train-1a2b3c, ${busy.jobs_served} served, 1.23 node-h`);
  });

  it('a Release the launcher refuses says why, in one line under the pools', async () => {
    const source = new RecordingSource(fx.pools.pools);
    source.request = async <T>(method: string): Promise<T> => {
      if (method === 'DELETE') {
        throw new Error('pool: no pool; list them with GET /api/pools');
      }
      return { pools: fx.pools.pools } as T;
    };
    const view = new PoolsView(source);
    await view.release(fx.pools.pools[0].id);
    expect(view.node.querySelector('.dlc-pools-error')!.textContent).toBe(
      'pools: pool: no pool; list them with GET /api/pools'
    );
    expect(view.node.querySelectorAll('.dlc-pool').length).toBe(fx.pools.pools.length);
  });
});
