"""The engine's Faust app, its topics and its table.

Configured from the environment so that ``faust -A streams.engine worker``
and ``settlement worker`` build the same app (:mod:`streams.engine` registers
the agents and timers on it; they import this module, so it imports none of
them):

* ``SETTLEMENT_CONNECTION_STRING`` (required): ``Endpoint=kafka://...;Namespace=...``
* ``SETTLEMENT_DATA_DIR``: where RocksDB keeps the tables (default ``./data/engine``)
* ``SETTLEMENT_WEB_PORT``: Faust's web server port (disabled when unset)
* ``SETTLEMENT_METRICS_PORT``: where :mod:`streams.metrics` serves Prometheus
  metrics (``/metrics``; not served when unset)
* ``SETTLEMENT_TIMER_INTERVAL``: seconds between lock-expiry sweeps (default 0.5)
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import replace
from pathlib import Path

import faust
from confluent_kafka.admin import AdminClient

from streams import kafka_tuning, record_sender
from streams.record_sender import RecordSender
from topics import names, specs
from topics.connection import ENGINE_CLIENT_ID, parse_connection_string
from topics.partitions import command_partition

_conn = os.environ.get("SETTLEMENT_CONNECTION_STRING")
if not _conn:
    raise RuntimeError(
        "SETTLEMENT_CONNECTION_STRING is not set: run the engine with "
        "'settlement worker --connection-string \"Endpoint=kafka://HOST:PORT;Namespace=NAME\"'"
    )
#: An engine worker runs for long and has many Kafka clients: each tries a
#: broker that is away again after half a second, not librdkafka's 100 ms
#: (measured with the brokers away 30 s: 2.2-2.3 % of a core instead of
#: 3.4-4.2 %). Its one-shot clients at start keep the default: a client's
#: first connection waits half of it.
ENGINE_RECONNECT_BACKOFF_MS = 500
_given = parse_connection_string(_conn)
settings = replace(_given, reconnect_backoff_ms=ENGINE_RECONNECT_BACKOFF_MS,
                   client_id=ENGINE_CLIENT_ID)
kafka_tuning.apply(settings)
namespace = settings.namespace
kafka_tuning.leave_to_intake(names.commands(namespace))  # streams.command_intake reads them
# Before Faust starts: it would declare missing topics itself, with the
# broker's default partition count instead of the namespace's spec.
#: The namespace's engine partitions, its commands topic's partition count
#: (8 if this worker makes the namespace): the most workers that share its
#: work; the commands, events and state topics and the tables have that many.
engine_partitions = specs.provision_namespace(AdminClient(_given.kafka_config()), namespace,
                                              settings.profile.replication_factor, tables=True)
_data_dir = Path(os.environ.get("SETTLEMENT_DATA_DIR", "data/engine")).resolve()


def _instance_id(data_dir: Path) -> str:
    """This worker's name in the consumer group: kept in its data dir, so it
    goes with the state it names (two containers may both use ``/data``)."""
    path = data_dir / "group-instance-id"
    if path.exists():
        return path.read_text().strip()
    data_dir.mkdir(parents=True, exist_ok=True)
    ident = f"{names.engine_app_id(namespace)}-{uuid.uuid4().hex[:12]}"
    path.write_text(ident)
    return ident


_web_port = os.environ.get("SETTLEMENT_WEB_PORT")
_metrics_port = os.environ.get("SETTLEMENT_METRICS_PORT")
metrics_port = int(_metrics_port) if _metrics_port else None
timer_interval = float(os.environ.get("SETTLEMENT_TIMER_INTERVAL", "0.5"))

app = faust.App(
    names.engine_app_id(namespace),
    broker=[f"kafka://{host}" for host in settings.bootstrap_servers.split(",")],
    # The connection string's SASL settings, so that the engine's own
    # consumer and producer authenticate like every other client.
    broker_credentials=settings.faust_credentials(),
    store="rocksdb://",
    datadir=_data_dir,
    # Static group membership: a worker restarted on its data dir (after a
    # crash, say) takes its place in the group back at once, instead of
    # waiting for the dead process's session to time out and a rebalance.
    consumer_group_instance_id=_instance_id(_data_dir),
    topic_partitions=engine_partitions,
    topic_allow_declare=True,
    # The table's changelog gets as many replicas as the namespace's topics.
    topic_replication_factor=settings.profile.replication_factor,
    autodiscover=False,
    web_enabled=_web_port is not None,
    web_port=int(_web_port or 6066),
    # Short group timeouts: Tansu holds a JoinGroup for half the session
    # timeout, and a restarted worker must get its partitions back quickly.
    broker_session_timeout=6,
    broker_heartbeat_interval=1,
    broker_rebalance_timeout=20,
    broker_commit_interval=1.0,
    consumer_auto_offset_reset="earliest",
    broker_client_id=ENGINE_CLIENT_ID,  # Faust's own clients too (its default: faust-VERSION)
    producer_acks=-1,
    producer_linger_ms=0,  # answers are latency-bound; load batches by itself
    table_standby_replicas=0,
    stream_wait_empty=False,
    key_serializer="raw",
    value_serializer="raw",  # every record is bytes we encode ourselves
)


def _bytes_topic(name: str, partitions: int) -> faust.TopicT:
    """A topic of raw bytes keys and values; the record formats are ours."""
    return app.topic(name, key_type=bytes, value_type=bytes, partitions=partitions)


commands_topic = _bytes_topic(names.commands(namespace), engine_partitions)
replies_topic = _bytes_topic(names.replies(namespace), specs.REPLY_PARTITIONS)
events_topic = _bytes_topic(names.events(namespace), engine_partitions)
state_topic = _bytes_topic(names.state(namespace), engine_partitions)


def window_partition(window_key: str) -> int:
    """The commands partition of a window: the worker that owns it, and the
    partition of the tables that hold its state."""
    return command_partition(window_key, engine_partitions)


#: RocksDB options of both tables. The engine's state is small and rewritten
#: all the time (a window's entries, headers and indexes): with Faust's 64 MB
#: write buffers, sending 2,000 sessions of ten grew the data directory by
#: 16.5 MB (130 MB after 100,000 idle sessions; most of it the write-ahead
#: log, which the engine no longer writes: streams/table_store.py) for about
#: 1 MB of keys. 1 MB buffers flush that often instead, and what a killed
#: worker had not flushed, read again from the changelog, stays small.
_ROCKSDB = {"write_buffer_size": 1 << 20}

#: entity#partition -> a window's header (:meth:`streams.window.InflightWindow.to_bytes`),
#: small, so that timers can read every header.
headers = app.Table("headers", default=None, key_type=bytes, value_type=bytes,
                    partitions=engine_partitions, options=dict(_ROCKSDB))
#: everything else of the windows: entries, timers, answers (see streams.window).
entries = app.Table("entries", default=None, key_type=bytes, value_type=bytes,
                    partitions=engine_partitions, options=dict(_ROCKSDB))
assert (headers.name, entries.name) == specs.ENGINE_TABLES


def stored_headers() -> list[tuple[bytes, bytes | None]]:
    """Every window header this worker stores, read once. Through iter():
    list() of the table's items would first ask their number, which Faust's
    RocksDB store counts by reading every key again (the lock timer's sweep,
    twice a second, spent most of its time there: 4 % of the engine's main
    thread while a queue was drained in batches of 100)."""
    return list(iter(headers.items()))


class HeaderLines:
    """The first line of each window header this worker stores
    (``b"<wake_ms> [scan]"``, :meth:`streams.window.InflightWindow.to_bytes`):
    all that the lock timer (twice a second) and the scan timer (once a
    second) read of every window. The stored header is the window's whole
    commit record, 6.5 KB for a filtered subscription: reading them all from
    RocksDB for those timers was a tenth of the engine's Python time while a
    topic with ten subscriptions was published (py-spy).

    The engine writes every header itself (:meth:`noted`); only Faust's
    recovery of the tables writes around it, so the lines are read from the
    table again after each rebalance, once its tables are recovered, and
    every :data:`RELIST_S` in any case."""

    RELIST_S = 30.0

    def __init__(self) -> None:
        self._lines: dict[bytes, bytes] = {}
        self._listed_at: float | None = None  # None: to be listed again
        #: counts the windows added and removed: a timer that lists the
        #: windows once a second lists them again when it moved
        self.changes = 0

    def items(self) -> list[tuple[bytes, bytes]]:
        """``(window key, first line)`` of every stored window header."""
        if self._listed_at is None or time.monotonic() - self._listed_at > self.RELIST_S:
            self._lines = {key: _first_line(raw) for key, raw in stored_headers() if raw}
            self._listed_at = time.monotonic()
            self.changes += 1
        return list(self._lines.items())

    def noted(self, key: bytes, raw: bytes | None) -> None:
        """The engine wrote ``raw`` as the header of window ``key`` (None: deleted it)."""
        if raw:
            self.changes += key not in self._lines
            self._lines[key] = _first_line(raw)
        elif self._lines.pop(key, None) is not None:
            self.changes += 1

    def forget(self) -> None:
        """Partitions moved: list the table again when next asked."""
        self._listed_at = None


def _first_line(raw: bytes) -> bytes:
    end = raw.find(b"\n")
    return raw if end < 0 else raw[:end]


header_lines = HeaderLines()


@app.on_partitions_revoked.connect
async def _headers_revoked(sender: object, /, *_: object, **__: object) -> None:
    header_lines.forget()


@app.on_rebalance_complete.connect
async def _headers_recovered(sender: object, /, *_: object, **__: object) -> None:
    header_lines.forget()


#: Every record the engine writes goes through a sender (streams.record_sender),
#: in order; three senders, each a producer with connections of its own, as a
#: broker answers the requests of one connection one after the other: what
#: a command waits for (its commit record, then its answer) never queues
#: behind the follow-up records of the commands before it, which nobody
#: waits for. ``commits``: the windows' headers (the commit records);
#: ``answers``: the replies; ``records``: the rest (entries under their own
#: keys, events, states). A key is only ever written through one of them.
#: how long the follow-up records wait for each other in librdkafka: sent
#: together they are one request per partition, where each record sent alone
#: went out in a request of its own as soon as it was produced (nobody waits
#: for them; the commit records carry them until Kafka holds them)
FOLLOW_UPS_LINGER_MS = 5
commits = RecordSender(settings.kafka_config())
answers = RecordSender(settings.kafka_config())
records = RecordSender(settings.kafka_config(), linger_ms=FOLLOW_UPS_LINGER_MS)


@app.on_before_shutdown.connect
async def _close_records(sender: object, /, *_: object, **__: object) -> None:
    # One wait for the three, commit records first (they carry the rest
    # again): a worker whose brokers are away must still stop in time.
    deadline = time.monotonic() + record_sender.CLOSE_WAIT_S
    for each in (commits, answers, records):
        each.close(max(0.0, deadline - time.monotonic()))
