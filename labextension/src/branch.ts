/**
 * "Branch from here": the cell a branch of a job starts from. The job's own cell (the lines
 * of its script that the source map says came from its `%%dlc` cell; the whole script for a
 * job from the CLI) under a `%%dlc` line with the job's shape and `--from JOB@STEP`, ready to
 * edit and run. No JupyterLab imports (jest-tested).
 */
import { JobSummary } from './store';

/** The lines of `script` that came from the job's own cell, or the whole script. */
export function ownCell(job: JobSummary, script: string): string {
  const source = (job.source ?? {}) as { cell?: unknown; lines?: unknown };
  const lines = script.replace(/\n$/, '').split('\n');
  const runs = Array.isArray(source.lines) ? (source.lines as unknown[]) : [];
  const picked: string[] = [];
  for (const run of runs) {
    // [first script line, cell, first line in that cell, count], 1-based (magics/capture.py)
    if (!Array.isArray(run) || run.length < 4 || run[1] !== source.cell) {
      continue;
    }
    const [first, , , count] = run as number[];
    picked.push(...lines.slice(first - 1, first - 1 + count));
  }
  return (picked.length ? picked : lines).join('\n');
}

/** The new cell's text: `%%dlc --nodes N --nproc-per-node M --from ID@STEP` and the cell. */
export function branchCell(job: JobSummary, script: string, step: number): string {
  const shape = `--nodes ${job.nodes} --nproc-per-node ${job.nproc_per_node}`;
  return `%%dlc ${shape} --from ${job.id}@${step}\n${ownCell(job, script)}`;
}
