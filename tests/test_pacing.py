"""The launcher's report pace (launcher/pacing.py) and how senders take it
(node_reporter.phase_shift): pure functions of counts and clocks, tested without a launcher;
tests/test_ingest.py follows a real node reporter through a real launcher's pace."""

from jupyter_dlc.launcher.pacing import ReportPacer
from jupyter_dlc.node.reporter import MAX_PACE, phase_shift


def test_the_pace_rises_as_senders_join_and_falls_only_at_a_recompute():
    pacer = ReportPacer(budget=100)
    assert pacer.heard(("j", "node", 0), now=10.0) == 0.0
    # 60 more nodes within the same second: 61/100 a second wants 0.5 s at once.
    paces = [pacer.heard(("j", "node", n), now=10.0 + n / 1000) for n in range(1, 61)]
    assert paces[0] == 0.0 and paces[-1] == 0.5 and paces == sorted(paces)
    assert pacer.heard(("j", "node", 200), now=10.5) == 0.5  # one more is not enough for 0.75
    # Only node 0 is heard from then on: the pace falls once the others are 5 s quiet.
    assert pacer.heard(("j", "node", 0), now=12.0) == 0.5
    assert pacer.heard(("j", "node", 0), now=16.0) == 0.0


def test_a_grown_pace_spreads_senders_over_the_new_interval_once():
    # 4,000 senders that started together at a quarter second, told to send once a second:
    # their first extra wait is a uniform share of the second (each quarter holds about a
    # quarter of them), so from then on they arrive one by one, not all in the same quarter.
    shifts = [phase_shift(0.25, MAX_PACE) for _ in range(4000)]
    assert all(0.0 <= s < MAX_PACE for s in shifts)
    quarters = [sum(1 for s in shifts if q / 4 <= s < (q + 1) / 4) for q in range(4)]
    assert all(800 < count < 1200 for count in quarters), quarters
    # A pace that stays or falls moves nobody.
    assert phase_shift(MAX_PACE, MAX_PACE) == 0.0 and phase_shift(MAX_PACE, 0.25) == 0.0
