import { RANK_PAGE_SIZE, Rank, rankPage } from '../src/views';

function rank(r: number, over: Partial<Rank> = {}): Rank {
  return {
    rank: r,
    node: Math.floor(r / 8),
    local_rank: r % 8,
    pid: 1000 + r,
    state: 'running',
    exit_code: null,
    last_step: 100 + (r % 3),
    last_heartbeat: 5000 + r,
    last_progress: 5000 + r,
    ...over
  };
}

describe('rankPage: the rank table of 4,096 ranks, paged and sorted', () => {
  const ranks = Array.from({ length: 4096 }, (_, r) =>
    rank(r, r === 4001 ? { last_step: 12 } : r === 17 ? { last_heartbeat: 10 } : r === 99 ? { last_step: null } : {})
  );

  it('pages by rank, clamping a page past the end', () => {
    const first = rankPage(ranks, 'rank', 0);
    expect(first.pages).toBe(Math.ceil(4096 / RANK_PAGE_SIZE));
    expect(first.rows.map(r => r.rank)).toEqual(Array.from({ length: RANK_PAGE_SIZE }, (_, i) => i));
    const last = rankPage(ranks, 'rank', 10 ** 6);
    expect(last.page).toBe(first.pages - 1);
    expect(last.rows[last.rows.length - 1].rank).toBe(4095);
  });

  it('sorts slowest step first (no step yet counts as slowest), and oldest heartbeat first', () => {
    expect(rankPage(ranks, 'step', 0).rows.slice(0, 2).map(r => r.rank)).toEqual([99, 4001]);
    expect(rankPage(ranks, 'heartbeat', 0).rows[0].rank).toBe(17);
  });
});
