/**
 * Jobs side by side in the panel, as `%dlc compare` shows them in a notebook (the Python
 * side is jupyter_dlc/compare.py): one metric's rank-0 curves by step and by wall time since
 * submit, the last and best values, the spec fields that differ, and each job's code diffed
 * against the first's. No JupyterLab imports (jest-tested); compareview.ts draws it.
 */

/** What the differences table leaves out: the code has its own diff, and these say where a
 * job came from rather than what it ran (as NOT_COMPARED in compare.py). */
export const NOT_COMPARED = new Set(['code', 'script', 'source', 'files', 'name', 'sweep']);
export const MAX_DIFF_LINES = 400;

export interface PointLike {
  rank: number | null;
  name: string;
  step: number | null;
  t: number;
  value: number | string | null;
}

/** Rank 0's finite points of `metric`: [step, value] and [seconds since `created`, value]. */
export function curves(points: PointLike[], metric: string, created: number): {
  byStep: [number, number][];
  byTime: [number, number][];
} {
  const mine = points
    .filter(p => p.rank === 0 && p.name === metric && p.step !== null && typeof p.value === 'number' &&
      isFinite(p.value))
    .sort((a, b) => (a.step as number) - (b.step as number));
  return {
    byStep: mine.map(p => [p.step as number, p.value as number]),
    byTime: mine.map(p => [p.t - created, p.value as number])
  };
}

/** The spec's fields to compare, with env, params and resources one entry a name. */
export function flatSpec(spec: Record<string, unknown>): Map<string, unknown> {
  const out = new Map<string, unknown>();
  for (const [key, value] of Object.entries(spec)) {
    if (NOT_COMPARED.has(key)) {
      continue;
    }
    if ((key === 'env' || key === 'params' || key === 'resources') && value && typeof value === 'object') {
      for (const [name, item] of Object.entries(value as Record<string, unknown>)) {
        out.set(`${key}.${name}`, item);
      }
    } else if (key === 'args' && Array.isArray(value)) {
      out.set(key, value.join(' '));
    } else {
      out.set(key, value);
    }
  }
  return out;
}

/** Every field whose values are not all the same, with each job's value (undefined: none). */
export function differences(specs: Record<string, unknown>[]): { field: string; values: unknown[] }[] {
  const flats = specs.map(flatSpec);
  const names: string[] = [];
  for (const flat of flats) {
    for (const name of flat.keys()) {
      if (!names.includes(name)) {
        names.push(name);
      }
    }
  }
  return names
    .map(field => ({ field, values: flats.map(f => f.get(field)) }))
    .filter(row => new Set(row.values.map(v => JSON.stringify(v ?? null))).size > 1);
}

export interface DiffLine {
  op: ' ' | '-' | '+';
  text: string;
}

/** A line diff of two texts (longest common subsequence), with runs of more than
 * 2 x `context` unchanged lines cut to their ends; at most MAX_DIFF_LINES lines. */
export function lineDiff(a: string, b: string, context = 2): DiffLine[] {
  const x = a.replace(/\n$/, '').split('\n');
  const y = b.replace(/\n$/, '').split('\n');
  // the common head and tail first: scripts differ in a few lines
  let head = 0;
  while (head < x.length && head < y.length && x[head] === y[head]) {
    head++;
  }
  let tail = 0;
  while (tail < x.length - head && tail < y.length - head && x[x.length - 1 - tail] === y[y.length - 1 - tail]) {
    tail++;
  }
  const xs = x.slice(head, x.length - tail);
  const ys = y.slice(head, y.length - tail);
  const lcs: number[][] = Array.from({ length: xs.length + 1 }, () => new Array(ys.length + 1).fill(0));
  for (let i = xs.length - 1; i >= 0; i--) {
    for (let j = ys.length - 1; j >= 0; j--) {
      lcs[i][j] = xs[i] === ys[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
    }
  }
  const middle: DiffLine[] = [];
  let i = 0;
  let j = 0;
  while (i < xs.length || j < ys.length) {
    if (i < xs.length && j < ys.length && xs[i] === ys[j]) {
      middle.push({ op: ' ', text: xs[i++] });
      j++;
    } else if (i < xs.length && (j === ys.length || lcs[i + 1][j] >= lcs[i][j + 1])) {
      middle.push({ op: '-', text: xs[i++] }); // the old line first, as unified diffs do
    } else {
      middle.push({ op: '+', text: ys[j++] });
    }
  }
  const all: DiffLine[] = [
    ...x.slice(0, head).map(text => ({ op: ' ' as const, text })),
    ...middle,
    ...x.slice(x.length - tail).map(text => ({ op: ' ' as const, text }))
  ];
  if (!all.some(line => line.op !== ' ')) {
    return [];
  }
  return cutUnchanged(all, context).slice(0, MAX_DIFF_LINES);
}

function cutUnchanged(lines: DiffLine[], context: number): DiffLine[] {
  const out: DiffLine[] = [];
  let run: DiffLine[] = [];
  const flush = (atStart: boolean, atEnd: boolean) => {
    const keepHead = atStart ? 0 : context;
    const keepTail = atEnd ? 0 : context;
    if (run.length > keepHead + keepTail + 1) {
      out.push(...run.slice(0, keepHead), { op: ' ', text: `… ${run.length - keepHead - keepTail} unchanged lines` },
        ...run.slice(run.length - keepTail));
    } else {
      out.push(...run);
    }
    run = [];
  };
  let started = false;
  for (const line of lines) {
    if (line.op === ' ') {
      run.push(line);
    } else {
      flush(!started, false);
      started = true;
      out.push(line);
    }
  }
  flush(!started, true);
  return out;
}

/** A value as the tables show it ("-" for none). */
export function valueText(value: unknown): string {
  if (value === undefined || value === null) {
    return '-';
  }
  if (typeof value === 'number') {
    return Number.isInteger(value) ? String(value) : value.toPrecision(4).replace(/\.?0+$/, '');
  }
  return typeof value === 'string' ? value : JSON.stringify(value);
}
