"""EventBridge's schedule expressions as the emulator reads them: rate(), cron() and at()."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from fnserve.emulator.schedules import Schedule

MONDAY = datetime(2026, 11, 23, 5, 58, 30, tzinfo=UTC)  # a Monday


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("rate(5 minutes)", datetime(2026, 11, 23, 6, 3, 30, tzinfo=UTC)),  # one period after the start
        ("rate(1 day)", datetime(2026, 11, 24, 5, 58, 30, tzinfo=UTC)),
        ("cron(0 12 * * ? *)", datetime(2026, 11, 23, 12, 0, tzinfo=UTC)),
        ("cron(0/15 * * * ? *)", datetime(2026, 11, 23, 6, 0, tzinfo=UTC)),
        ("cron(15 10 ? * MON-FRI *)", datetime(2026, 11, 23, 10, 15, tzinfo=UTC)),
        ("cron(0 6 ? * SAT,SUN *)", datetime(2026, 11, 28, 6, 0, tzinfo=UTC)),
        ("cron(0 18 ? * 1 2027)", datetime(2027, 1, 3, 18, 0, tzinfo=UTC)),  # 1 is Sunday in EventBridge
        ("cron(0 8 1 JAN-MAR ? *)", datetime(2027, 1, 1, 8, 0, tzinfo=UTC)),
        ("cron(58 5 23 11 ? 2026)", None),  # its only time has just passed
        ("at(2026-12-01T00:00:00)", datetime(2026, 12, 1, tzinfo=UTC)),
        ("at(2026-11-01T00:00:00)", None),
    ],
)
def test_the_next_time_after_a_moment(expression: str, expected: datetime | None) -> None:
    schedule = Schedule("F", "E", expression, "ScheduleV2")
    assert schedule.error is None
    assert schedule.next_after(MONDAY) == expected


def test_a_time_zone_and_a_disabled_schedule() -> None:
    paris = Schedule("F", "E", "cron(0 9 * * ? *)", "ScheduleV2", timezone="Europe/Paris")
    assert paris.next_after(MONDAY) == datetime(2026, 11, 23, 8, 0, tzinfo=UTC)  # 09:00 in Paris, in winter
    assert Schedule("F", "E", "rate(1 hour)", "Schedule", enabled=False).next_after(MONDAY) is None


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("cron(0 0 L * ? *)", "'L' is not emulated"),
        ("cron(0 0 ? * 6#3 *)", "'#' is not emulated"),
        ("cron(0 0 * * * *)", "one of day-of-month and day-of-week must be '?'"),
        ("cron(0 0 * *)", "needs six fields"),
        ("cron(61 0 * * ? *)", "minutes: '61' is outside 0-59"),
        ("cron(0 0 ? * FUNDAY *)", "day-of-week: 'FUNDAY' is not a value"),
        ("rate(0 days)", "must be a positive whole number"),
        ("rate(5 weeks)", "minute(s), hour(s) or day(s)"),
        ("every day", "is not rate(...), cron(...) or at(...)"),
    ],
)
def test_what_cannot_run_on_a_timer_says_why_and_never_fires(expression: str, why: str) -> None:
    schedule = Schedule("F", "E", expression, "Schedule")
    assert schedule.error is not None and why in schedule.error
    assert schedule.next_after(MONDAY) is None


def test_the_events_they_send() -> None:
    rule = Schedule("Fn", "Nightly", "rate(1 day)", "Schedule").payload(MONDAY)
    assert rule["detail-type"] == "Scheduled Event" and rule["time"] == "2026-11-23T05:58:30Z"
    assert rule["resources"] == ["arn:aws:events:us-east-1:123456789012:rule/Fn-Nightly"]
    assert Schedule("Fn", "E", "rate(1 day)", "ScheduleV2").payload(MONDAY) == {}
    assert Schedule("Fn", "E", "rate(1 day)", "Schedule", input='{"a": 1}').payload(MONDAY) == {"a": 1}
    assert "its Input is not JSON" in str(Schedule("Fn", "E", "rate(1 day)", "Schedule", input="{oops").error)
