import { JobDetail } from '../src/store';
import { RankAsk, RankPager, RankPageInfo } from '../src/rankpager';
import { RANK_PAGE_SIZE, RANK_SORTS, Rank, rankPagerText, rankStatesText } from '../src/views';
import { rankPageSortValues } from '../src/wire';

function rank(r: number): Rank {
  return {
    rank: r,
    node: Math.floor(r / 64),
    local_rank: r % 64,
    pid: 1000 + r,
    state: 'running',
    exit_code: null,
    last_step: 3,
    last_heartbeat: 5000,
    last_progress: 5000
  };
}

/** What the launcher answers to `ask` for a job of 4,096 ranks (the page clamped as it
 * clamps it; the rows are the page's ranks by rank, enough to tell pages apart). */
function answer(ask: RankAsk): JobDetail {
  const { rank_sort, rank_page, rank_page_size } = ask.query;
  const pages = Math.ceil(4096 / rank_page_size);
  const page = Math.min(rank_page, pages - 1);
  const info: RankPageInfo = {
    sort: rank_sort,
    page,
    pages,
    size: rank_page_size,
    total: 4096,
    states: { running: 4090, exited: 6 }
  };
  const first = page * rank_page_size;
  const ranks = Array.from({ length: Math.min(rank_page_size, 4096 - first) }, (_, i) => rank(first + i));
  return { ranks, rank_page: info } as unknown as JobDetail;
}

describe('RankPager: the rank table read a page at a time from the launcher', () => {
  it('asks for its order and page, 50 ranks a page', () => {
    const pager = new RankPager();
    expect(pager.ask().query).toEqual({ rank_sort: 'rank', rank_page: 0, rank_page_size: RANK_PAGE_SIZE });
    pager.turn({ by: +1 });
    pager.turn({ by: +1 });
    expect(pager.ask().query).toMatchObject({ rank_sort: 'rank', rank_page: 2 });
    pager.turn({ order: 'step' });
    expect(pager.ask().query).toMatchObject({ rank_sort: 'step', rank_page: 0 });
    pager.turn({ by: -1 });
    expect(pager.page).toBe(0);
  });

  it('shows the page the launcher answered, clamped to the last one', () => {
    const pager = new RankPager();
    pager.turn({ by: 1000 });
    const ask = pager.ask();
    const table = pager.take(ask, answer(ask));
    expect(table?.page.page).toBe(81);
    expect(pager.page).toBe(81);
    expect(table?.ranks[table.ranks.length - 1].rank).toBe(4095);
    expect(rankPagerText(table!.page)).toBe('4096 ranks · page 82 of 82');
    expect(rankStatesText(table!.page.states)).toBe('6 exited · 4090 running');
  });

  it('a late answer for an older page or order does not overwrite a newer one', () => {
    const pager = new RankPager();
    const tick = pager.ask(); // the refresh reads page 0
    pager.turn({ by: +1 });
    const turned = pager.ask(); // the page is turned while the refresh is out
    expect(pager.take(turned, answer(turned))?.page.page).toBe(1);
    expect(pager.take(tick, answer(tick))).toBeNull();
    expect(pager.page).toBe(1);

    // an answer for a page turned away from before it came is not drawn either
    pager.turn({ by: +1 });
    const two = pager.ask();
    pager.turn({ order: 'heartbeat' });
    const heartbeat = pager.ask();
    expect(pager.take(two, answer(two))).toBeNull();
    expect(pager.take(heartbeat, answer(heartbeat))?.page).toMatchObject({ sort: 'heartbeat', page: 0 });

    // of two reads of the same page, the older answer coming last is not drawn
    const first = pager.ask();
    const second = pager.ask();
    expect(pager.take(second, answer(second))).not.toBeNull();
    expect(pager.take(first, answer(first))).toBeNull();
  });

  it('another job: answers asked for the one before do not apply', () => {
    const pager = new RankPager();
    const before = pager.ask(); // page 0 of the job shown before
    pager.reset();
    expect(pager.page).toBe(0);
    const mine = pager.ask();
    expect(pager.take(before, answer(before))).toBeNull();
    expect(pager.take(mine, answer(mine))?.ranks[0].rank).toBe(0);
  });

  it('the orders are the launcher\'s', () => {
    expect(RANK_SORTS.map(([key]) => key)).toEqual([...rankPageSortValues]);
  });
});
