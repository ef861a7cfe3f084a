/**
 * The rank table's page, read from the launcher: `GET api/jobs/{id}?rank_sort=&rank_page=`
 * answers one page of the ranks, sorted in SQL, and `rank_page` (the page, the page count,
 * and the count of all ranks and of each state). At 4,096 ranks the whole list is 790 KB and
 * 30-40 ms of launcher CPU a read; a page is 50 rows.
 *
 * The detail reads the page on its refresh tick and at once when the page or order is
 * turned, so answers can come back out of order. The pager applies an answer only when it
 * was asked for the order and page wanted now, and after the answer shown: a late answer
 * for an older page, order or moment never overwrites a newer one. No DOM: jest tests it.
 */
import { JobDetail, Schemas } from './store';
import { RANK_PAGE_SIZE, Rank, RankOrder } from './views';
import { operations } from './wire';

export type RankPageInfo = Schemas['RankPage'];
export type RankQuery = Required<NonNullable<operations['getJob']['parameters']['query']>>;

/** One read of the page: its number, in the order asked, and its query. */
export interface RankAsk {
  seq: number;
  query: RankQuery;
}

/** An answer the table shows: the page's ranks and the pager's numbers. */
export interface RankTable {
  ranks: Rank[];
  page: RankPageInfo;
}

export class RankPager {
  order: RankOrder = 'rank';
  page = 0;
  private asked = 0;
  private shown = 0;

  constructor(readonly size = RANK_PAGE_SIZE) {}

  /** Go to the first page in another order, or `by` pages on (the launcher clamps past
   * the last page; the pager then takes the page it answered). */
  turn(to: { order: RankOrder } | { by: number }): void {
    if ('order' in to) {
      this.order = to.order;
      this.page = 0;
    } else {
      this.page = Math.max(0, this.page + to.by);
    }
  }

  /** Another job: back to the first page, and no answer asked until now applies. */
  reset(): void {
    this.page = 0;
    this.shown = this.asked;
  }

  /** A read of the page wanted now. */
  ask(): RankAsk {
    this.asked += 1;
    return {
      seq: this.asked,
      query: { rank_sort: this.order, rank_page: this.page, rank_page_size: this.size }
    };
  }

  /** The answer to `ask` as the table shows it, or null when it no longer applies. */
  take(ask: RankAsk, job: JobDetail): RankTable | null {
    const { rank_sort, rank_page } = ask.query;
    if (ask.seq <= this.shown || rank_sort !== this.order || rank_page !== this.page) {
      return null;
    }
    this.shown = ask.seq;
    // A launcher older than paging answers every rank, by rank: one page of them all (as
    // the notebook view reads it, widgets/job_widgets.py show_ranks).
    const page = job.rank_page ?? {
      sort: 'rank',
      page: 0,
      pages: 1,
      size: job.ranks.length,
      total: job.ranks.length,
      states: countStates(job.ranks)
    };
    this.page = page.page;
    return { ranks: job.ranks, page };
  }
}

function countStates(ranks: Rank[]): Record<string, number> {
  const states: Record<string, number> = {};
  for (const r of ranks) {
    states[r.state] = (states[r.state] ?? 0) + 1;
  }
  return states;
}
