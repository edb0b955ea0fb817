"""The engine's records to Kafka, through librdkafka, in the order sent.

Faust sends a table's changelog records (``send_changelog``) and a topic's
records (``Topic.send``) along its own path: a buffer drained one record per
turn of the event loop, with a message object, callbacks and sensors for each,
then aiokafka's producer, which builds and sends every batch in Python. With
eight threads settling one message at a time that producer took a fifth of
the engine's time, and a commit record waited behind the follow-up records of
the commands before it.

Here every record goes to a confluent-kafka producer (librdkafka builds,
compresses and sends the batches in its own threads) in the order given: a
key's later value never overtakes its earlier one in a compacted topic. Its
future resolves, on the event loop, to the record's offset once Kafka
acknowledged it. A thread serves librdkafka's delivery reports and hands them
to the loop in groups, one wake-up per group.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

log = logging.getLogger(__name__)

#: How long closing waits for the records still on their way (the commit
#: records carry what they are for again, so one lost at shutdown is redone).
CLOSE_WAIT_S = 2.0
#: How long one poll of the delivery reports waits: it returns as soon as a
#: report comes, so this only bounds how late the thread sees it is closed;
#: each empty poll wakes the thread (and takes the GIL) for nothing.
_POLL_S = 0.5


class RecordSender:
    """Sends records with a librdkafka producer, in order."""

    def __init__(self, kafka_config: dict[str, Any], *, linger_ms: float = 0) -> None:
        self._producer = Producer({
            **kafka_config,
            "acks": "all",
            "enable.idempotence": True,  # in order and once, retries included
            # 0 for what a caller waits for (a heavy load batches by itself)
            "linger.ms": linger_ms,
            # keys to the partitions Java clients (and aiokafka) pick: the
            # state topic is compacted by key, so a key must stay in one
            "partitioner": "murmur2_random",
        })
        self._loop: asyncio.AbstractEventLoop | None = None
        #: delivery reports of the current poll, handed to the loop together
        self._reports: list[tuple[asyncio.Future[int], KafkaError | None, int]] = []
        #: delivery reports come in whichever thread polls (flush() polls too)
        self._reports_lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve_reports, name="engine-records",
                                        daemon=True)

    def send(self, topic: str, key: bytes | None, value: bytes | None,
             partition: int | None = None) -> asyncio.Future[int]:
        """Send a record (``value`` None: a tombstone); the future resolves
        to its offset once Kafka acknowledged it (``partition`` None: by key)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._thread.start()
        acked: asyncio.Future[int] = self._loop.create_future()

        def delivered(err: KafkaError | None, msg: Message) -> None:
            with self._reports_lock:
                self._reports.append((acked, err, msg.offset() or 0))

        while True:
            try:
                self._producer.produce(topic, value, key,
                                       -1 if partition is None else partition,  # -1: by key
                                       on_delivery=delivered)
                return acked
            except BufferError:  # librdkafka's queue is full: the thread frees it
                self._producer.flush(0.1)
            except KafkaException as exc:
                acked.set_exception(exc)
                return acked

    def close(self, wait: float = CLOSE_WAIT_S) -> None:
        """Wait up to ``wait`` seconds for the records on their way, then stop."""
        left = self._producer.flush(wait)
        if left:
            log.warning("%d engine record(s) not acknowledged at shutdown; the commit "
                        "records that carry them are applied again at the next start", left)
        self._closed.set()

    def _serve_reports(self) -> None:
        while not self._closed.is_set():
            self._producer.poll(_POLL_S)
            with self._reports_lock:
                reports, self._reports = self._reports, []
            if reports:
                assert self._loop is not None
                try:
                    self._loop.call_soon_threadsafe(_resolve, reports)
                except RuntimeError:  # the loop closed: nobody waits any more
                    return


def _resolve(reports: list[tuple[asyncio.Future[int], KafkaError | None, int]]) -> None:
    for acked, err, offset in reports:
        if acked.done():
            continue
        if err is None:
            acked.set_result(offset)
        else:
            acked.set_exception(KafkaException(err))
