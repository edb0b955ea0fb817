"""The engine's clock of a commands partition (streams/log_clock.py): the
newest append time read, up to the record it is at."""

from __future__ import annotations

from streams.log_clock import LogClock

#: stamped by the broker (LogAppendTime), or by the producer
LOG_APPEND_TIME, CREATE_TIME = True, False


def test_a_partitions_time_is_the_newest_append_time_read() -> None:
    clock = LogClock()
    assert clock.now(3) is None and clock.behind(3, 0)
    clock.observe(3, 10, 1_000, LOG_APPEND_TIME)
    clock.observe(3, 11, 900, LOG_APPEND_TIME)  # a new leader's clock a little behind
    assert clock.now(3) == 1_000
    assert clock.behind(3, 1_001) and not clock.behind(3, 1_000)
    assert clock.now(4) is None


def test_reading_again_from_an_earlier_offset_takes_the_time_back_to_it() -> None:
    """After a seek back to the committed offset, a settlement read again is
    judged at its own place in the log, not at the time of records after it
    that were read before the seek."""
    clock = LogClock()
    for offset, stamp in ((5, 1_000), (6, 1_010), (7, 9_000)):
        clock.observe(0, offset, stamp, LOG_APPEND_TIME)
    assert clock.now(0) == 9_000
    clock.observe(0, 6, 1_010, LOG_APPEND_TIME)
    assert clock.now(0) == 1_010
    clock.observe(0, 7, 9_000, LOG_APPEND_TIME)
    assert clock.now(0) == 9_000


def test_a_partition_of_producer_times_runs_on_the_wall_clock_and_forget_clears_all() -> None:
    clock = LogClock()
    clock.observe(1, 0, 5, CREATE_TIME)
    now = clock.now(1)
    assert now is not None and now > 1_700_000_000_000
    clock.observe(1, 1, 2_000, LOG_APPEND_TIME)
    assert clock.now(1) == 2_000
    clock.forget()
    assert clock.now(1) is None
