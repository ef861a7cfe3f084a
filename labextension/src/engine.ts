import { Schemas } from './store';

export type EngineReport = Schemas['EngineReport'];

/** The detail's buttons an engine capability gates: absent, the button says why it is off. */
const GATED: Record<string, string> = {
  branches: 'dlc-action-branch'
};

/** What a job's engine cannot do for it, as the detail shows it: one line naming the
 * features (empty when it can do everything), and the buttons to disable with the reason
 * as their title. */
export function engineLimits(report: EngineReport | undefined): {
  line: string;
  disabled: Record<string, string>;
} {
  if (!report) {
    return { line: '', disabled: {} };
  }
  if (report.error) {
    return { line: `${report.name}: ${report.error}`, disabled: {} };
  }
  const disabled: Record<string, string> = {};
  for (const missing of report.cannot) {
    const button = GATED[missing.capability];
    if (button) {
      disabled[button] = `${report.name} cannot do this for this job: ${missing.feature}`;
    }
  }
  const line = report.cannot.length
    ? `Not on ${report.name} for this job: ${report.cannot.map(c => c.feature).join('; ')}`
    : '';
  return { line, disabled };
}
