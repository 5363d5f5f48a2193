"""SAM ``Schedule`` (EventBridge rules) and ``ScheduleV2`` (EventBridge Scheduler) events, on a timer.

Both expression forms EventBridge takes:

- ``rate(5 minutes)``: every period, the first one period after the emulator starts (as a rule's
  first run comes one period after it is created);
- ``cron(minutes hours day-of-month month day-of-week year)``: EventBridge's six fields, with
  ``, - * / ?``, month and weekday names, and day-of-week 1-7 meaning SUN-SAT; in UTC, or in a
  ScheduleV2's ``ScheduleExpressionTimezone``. ``L``, ``W`` and ``#`` are not emulated: such a
  schedule is named in a warning and runs only when triggered by hand.

A rule's event is EventBridge's "Scheduled Event" document, or its ``Input`` when it has one;
a ScheduleV2's is its ``Input`` (``{}`` without one). Any schedule can be run at once with
``POST /_fnserve/schedules/{function}/{event}`` (a daily job does not wait a day in development).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from fnserve.aws.events import scheduled_event

MONTHS = {m: i for i, m in enumerate("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split(), start=1)}
WEEKDAYS = {d: i for i, d in enumerate("SUN MON TUE WED THU FRI SAT".split(), start=1)}  # EventBridge: 1 is Sunday
RATE_UNITS = {"minute": 60, "minutes": 60, "hour": 3600, "hours": 3600, "day": 86400, "days": 86400}
HORIZON_DAYS = 366 * 5  # a cron that matches no day within this never fires


class ScheduleError(ValueError):
    """An expression EventBridge would refuse, or one the emulator cannot run on a timer."""


@dataclass(frozen=True)
class Cron:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int] | None  # day of month; None: '?' (the weekday decides)
    months: frozenset[int]
    weekdays: frozenset[int] | None  # 1-7, SUN-SAT; None: '?'
    years: frozenset[int]

    def matches(self, day: date) -> bool:
        if day.month not in self.months or day.year not in self.years:
            return False
        if self.days is not None and day.day not in self.days:
            return False
        return self.weekdays is None or (day.isoweekday() % 7) + 1 in self.weekdays

    def next_after(self, moment: datetime) -> datetime | None:
        """The first time strictly after ``moment`` (whole minutes, in ``moment``'s zone), or None."""
        start = (moment + timedelta(minutes=1)).replace(second=0, microsecond=0)
        day = start.date()
        for _ in range(HORIZON_DAYS):
            if self.matches(day):
                for hour in sorted(self.hours):
                    for minute in sorted(self.minutes):
                        candidate = datetime(day.year, day.month, day.day, hour, minute, tzinfo=moment.tzinfo)
                        if candidate >= start:
                            return candidate
            day += timedelta(days=1)
        return None


def _field(text: str, low: int, high: int, names: dict[str, int], what: str) -> frozenset[int]:
    values: set[int] = set()
    for part in text.upper().split(","):
        body, _, step_text = part.partition("/")
        step = int(step_text) if step_text.isdigit() and int(step_text) > 0 else None
        if step_text and step is None:
            raise ScheduleError(f"{what}: {part!r} has a bad increment")
        if body == "*":
            first, last = low, high
        else:
            start_text, dash, end_text = body.partition("-")
            first = _value(start_text, names, what)
            last = _value(end_text, names, what) if dash else (high if step else first)
        if not low <= first <= high or not low <= last <= high or first > last:
            raise ScheduleError(f"{what}: {part!r} is outside {low}-{high}")
        values.update(range(first, last + 1, step or 1))
    return frozenset(values)


def _value(text: str, names: dict[str, int], what: str) -> int:
    if text in names:
        return names[text]
    if not text.isdigit():
        raise ScheduleError(f"{what}: {text!r} is not a value")
    return int(text)


def parse_cron(fields: str) -> Cron:
    parts = fields.split()
    if len(parts) != 6:
        raise ScheduleError(f"cron({fields}) needs six fields: minutes hours day-of-month month day-of-week year")
    minutes, hours, days, months, weekdays, years = parts
    for special in ("L", "W", "#"):
        if special in days.upper() or special in weekdays.upper():
            raise ScheduleError(f"cron({fields}): {special!r} is not emulated")
    if (days == "?") == (weekdays == "?"):
        raise ScheduleError(f"cron({fields}): one of day-of-month and day-of-week must be '?', not both")
    return Cron(
        minutes=_field(minutes, 0, 59, {}, "minutes"),
        hours=_field(hours, 0, 23, {}, "hours"),
        days=None if days == "?" else _field(days, 1, 31, {}, "day-of-month"),
        months=_field(months, 1, 12, MONTHS, "month"),
        weekdays=None if weekdays == "?" else _field(weekdays, 1, 7, WEEKDAYS, "day-of-week"),
        years=_field(years, 1970, 2199, {}, "year"),
    )


def parse_rate(body: str) -> float:
    """``5 minutes`` -> 300.0 seconds."""
    value, _, unit = body.strip().partition(" ")
    if not value.isdigit() or int(value) < 1 or unit.strip() not in RATE_UNITS:
        raise ScheduleError(f"rate({body}) must be a positive whole number and minute(s), hour(s) or day(s)")
    return int(value) * RATE_UNITS[unit.strip()]


@dataclass
class Schedule:
    """One schedule event of a function, and when it fires next."""

    function: str
    event: str  # the event's name in the template
    expression: str
    kind: str  # "Schedule" (an EventBridge rule) or "ScheduleV2" (EventBridge Scheduler)
    enabled: bool = True
    input: str | None = None
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        """Parse the expression; what cannot run on a timer is kept in ``error`` (it runs when triggered)."""
        self.rate: float | None = None
        self.cron: Cron | None = None
        self.at: datetime | None = None
        self.error: str | None = None
        try:
            self.zone: Any = UTC if self.timezone == "UTC" else ZoneInfo(self.timezone)
            text = self.expression.strip()
            if text.startswith("rate(") and text.endswith(")"):
                self.rate = parse_rate(text[5:-1])
            elif text.startswith("cron(") and text.endswith(")"):
                self.cron = parse_cron(text[5:-1])
            elif text.startswith("at(") and text.endswith(")"):
                self.at = datetime.fromisoformat(text[3:-1]).replace(tzinfo=self.zone)
            else:
                raise ScheduleError(f"{self.expression!r} is not rate(...), cron(...) or at(...)")
            if self.input is not None:
                try:  # what it would send: JSON, or refused now rather than at its time
                    json.loads(self.input)
                except ValueError as exc:
                    raise ScheduleError(f"its Input is not JSON: {exc}") from None
        except (ZoneInfoNotFoundError, ValueError) as exc:  # ScheduleError is a ValueError
            self.zone = UTC
            self.error = str(exc) if isinstance(exc, ScheduleError) else f"{self.expression!r} ({self.timezone}): {exc}"

    def next_after(self, moment: datetime) -> datetime | None:
        """When it fires next after ``moment`` (an aware time), or None when it never will (or is disabled)."""
        if not self.enabled or self.error is not None:
            return None
        if self.rate is not None:
            return moment + timedelta(seconds=self.rate)
        if self.cron is not None:
            found = self.cron.next_after(moment.astimezone(self.zone))
            return None if found is None else found.astimezone(UTC)
        assert self.at is not None
        return self.at.astimezone(UTC) if self.at > moment else None

    def payload(self, when: datetime) -> Any:
        """The event the function gets at ``when``."""
        if self.input is not None:
            return json.loads(self.input)
        if self.kind == "ScheduleV2":
            return {}
        return scheduled_event(f"{self.function}-{self.event}", when.timestamp())
