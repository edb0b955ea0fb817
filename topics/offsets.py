"""Log end offsets that are right on every Kafka-protocol broker.

Tansu answers ListOffsets(latest) with the last batch's base offset + 1, not
the log end (after one batch of 1,000 records it says 1); the high watermark
in a fetch response is right. So the end of a partition is read from a fetch:
ListOffsets gives a lower bound, a fetch from just below it returns one small
batch and the true high watermark. On Apache Kafka both agree and this costs
one fetch.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, TopicPartition

_UNKNOWN = -1001  # librdkafka's OFFSET_INVALID in cached watermarks


def log_end_offsets(consumer: Consumer, partitions: list[tuple[str, int]],
                    timeout: float = 10.0) -> dict[tuple[str, int], int]:
    """End offsets of ``partitions``, read from fetch responses.

    ``consumer`` must be a consumer used only for this (it is re-assigned).
    """
    deadline = time.monotonic() + timeout
    lower = {tp: consumer.get_watermark_offsets(TopicPartition(*tp), timeout=timeout)[1]
             for tp in partitions}
    consumer.assign([TopicPartition(t, p, max(0, lower[(t, p)] - 1)) for t, p in partitions])
    ends: dict[tuple[str, int], int] = {}
    try:
        while len(ends) < len(partitions):
            if time.monotonic() > deadline:
                missing = sorted(set(partitions) - set(ends))
                raise TimeoutError(f"no fetch response for {missing} within {timeout}s")
            consumer.consume(num_messages=500, timeout=0.02)
            for tp in partitions:
                high = consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)[1]
                if high != _UNKNOWN and high >= lower[tp]:
                    ends[tp] = high
    finally:
        consumer.unassign()
    return ends
