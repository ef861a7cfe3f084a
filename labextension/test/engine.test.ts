import { EngineReport, engineLimits } from '../src/engine';

describe('engineLimits', () => {
  it('says nothing and gates nothing for an engine that can do everything shown', () => {
    const report: EngineReport = { name: 'local', capabilities: { branches: true }, cannot: [] };
    expect(engineLimits(report)).toEqual({ line: '', disabled: {} });
    expect(engineLimits(undefined)).toEqual({ line: '', disabled: {} });
  });

  it('names what is missing and turns Branch off with the reason', () => {
    const report: EngineReport = {
      name: 'kubernetes',
      capabilities: { branches: false, warm_pools: false },
      cannot: [
        { capability: 'warm_pools', feature: 'Warm pools' },
        { capability: 'branches', feature: 'Branch from a step' }
      ]
    };
    const limits = engineLimits(report);
    expect(limits.line).toBe('Not on kubernetes for this job: Warm pools; Branch from a step');
    expect(limits.disabled).toEqual({
      'dlc-action-branch': 'kubernetes cannot do this for this job: Branch from a step'
    });
  });

  it('says why the engine could not be asked', () => {
    const report: EngineReport = { name: 'pbs', capabilities: {}, cannot: [], error: 'not installed' };
    expect(engineLimits(report).line).toBe('pbs: not installed');
  });
});
