"""Wires alert rules into the supervisor's tick (filled in with the alert evaluator)."""


def attach_alerts(supervisor) -> None:
    del supervisor
