"""What the broker behind a connection string can do: the one place where
Tansu (the compatibility target) and Apache Kafka are told apart.

Users write ``Endpoint=kafka://HOST:PORT;Namespace=NAME`` and nothing else;
every broker-specific choice of the library and the engine reads a
:class:`BrokerProfile` instead of a connection-string key.

Detection asks the broker to describe its own configuration (DescribeConfigs
on a broker resource). Apache Kafka answers with hundreds of settings,
``log.cleaner.enable`` among them; Tansu 0.6 answers with none. The answer is
cached per bootstrap list, so a process asks once. The rest of the code reads
the profile's capabilities, never its ``kind``. A broker that does not
answer gets the cautious profile (short fetch waits, log ends from fetches,
which are right on every broker), uncached, so the next client asks again;
whatever it was about to do then fails with its own clear error.

What differs, as measured on these machines (see the design brief):

* Apache Kafka wakes a waiting fetch as soon as data arrives; Tansu parks it
  for the whole ``fetch.wait.max.ms``, so consumers there must wait briefly.
* Tansu answers ListOffsets(latest) with the last batch's base offset + 1, not
  the log end; Apache Kafka's answer is exact.
* Tansu may answer a fetch with a batch appended after one it is still
  writing, and the consumer reads on past the earlier records
  (:class:`topics.offsets.GapGuard` reads them again); Apache Kafka makes a
  record readable only once every one before it is.
* Apache Kafka compacts, runs transactions and deletes records (DeleteRecords);
  Tansu's in-memory storage does none of these.
* Apache Kafka may run several brokers: topics get up to three replicas.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource

#: How long a consumer may wait for data on a broker that wakes waiting fetches.
_WAKING_FETCH_WAIT_MS = 500
#: ... and on one that parks every fetch for the whole wait (Tansu); also
#: the wait of a consumer that never waits for new records.
SHORT_FETCH_WAIT_MS = 10
_DETECT_TIMEOUT_S = 5.0
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BrokerProfile:
    """The broker's behaviour that the library and the engine adapt to."""

    kind: str  # "apache-kafka" or "tansu"
    brokers: int
    wakes_waiting_fetches: bool
    exact_list_offsets: bool
    skips_unfinished_appends: bool
    compacts: bool
    deletes_records: bool
    transactions: bool

    @property
    def fetch_max_wait_ms(self) -> int:
        """How long a fetch may wait for data without adding latency."""
        return _WAKING_FETCH_WAIT_MS if self.wakes_waiting_fetches else SHORT_FETCH_WAIT_MS

    @property
    def replication_factor(self) -> int:
        """Replicas of every topic the project creates: up to three, one per broker."""
        return min(3, self.brokers)


APACHE_KAFKA = BrokerProfile("apache-kafka", 1, wakes_waiting_fetches=True,
                             exact_list_offsets=True, skips_unfinished_appends=False,
                             compacts=True, deletes_records=True,
                             transactions=True)
TANSU = BrokerProfile("tansu", 1, wakes_waiting_fetches=False, exact_list_offsets=False,
                      skips_unfinished_appends=True, compacts=False, deletes_records=False,
                      transactions=False)

_cache: dict[tuple[str, tuple[tuple[str, str], ...]], BrokerProfile] = {}
_lock = threading.Lock()


def detect(config: dict[str, object]) -> BrokerProfile:
    """The profile of the cluster that the librdkafka ``config`` connects to (cached)."""
    key = (str(config["bootstrap.servers"]),
           tuple(sorted((k, str(v)) for k, v in config.items() if k != "logger")))
    with _lock:
        if key not in _cache:
            found = _ask(config)
            if found is None:
                return TANSU
            _cache[key] = found
        return _cache[key]


def _ask(config: dict[str, object]) -> BrokerProfile | None:
    # confluent-kafka types conf values as str, int, float or bool, but the
    # client also takes a logger (kafka_config's "logger") and callbacks.
    admin = AdminClient(config)  # type: ignore[arg-type]
    try:
        metadata = admin.list_topics(timeout=_DETECT_TIMEOUT_S)
        broker_id = str(min(metadata.brokers))
        resource = ConfigResource(ConfigResource.Type.BROKER, broker_id)
        described = admin.describe_configs([resource], request_timeout=_DETECT_TIMEOUT_S)
        settings = described[resource].result(timeout=_DETECT_TIMEOUT_S)
    except (KafkaException, ValueError) as exc:
        log.warning("no Kafka broker answered at %s (%s): is it running?",
                    config["bootstrap.servers"], exc)
        return None
    template = APACHE_KAFKA if "log.cleaner.enable" in settings else TANSU
    return BrokerProfile(**{**template.__dict__, "brokers": len(metadata.brokers)})
