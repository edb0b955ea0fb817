"""A namespace's own settings, as ``azure.servicebus.management``'s
``NamespaceProperties``: here, the limit on engine commands per second, and
its engine partitions.

The limit is one record of the namespace's entities topic, beside the entity
definitions, so every engine worker follows them the way it follows queue
policies (``streams.definitions``) and a change needs no restart. Its key,
:data:`NAMESPACE_KEY`, starts with ``$``, which no entity name may, so it
cannot collide with a queue or a topic. The engine partitions are not in it:
they are the partition count of the namespace's commands topic, which Kafka
keeps and every client reads (:func:`topics.specs.provision_namespace`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from topics.entities.json_form import definition_json

#: the key of the namespace's record on the entities topic
NAMESPACE_KEY = "$namespace"
#: engine partitions of a namespace made without saying how many
DEFAULT_ENGINE_PARTITIONS = 8
#: Each partition a worker owns opens a RocksDB store per engine table and a
#: fetch of the commands topic; a few hundred is past any machine count a
#: namespace needs and keeps a lone worker's start (it owns them all) short.
MAX_ENGINE_PARTITIONS = 256


def validate_engine_partitions(count: int) -> int:
    """``count`` if a namespace can have that many engine partitions, else ValueError."""
    if isinstance(count, bool) or not isinstance(count, int) \
            or not 1 <= count <= MAX_ENGINE_PARTITIONS:
        raise ValueError(f"engine_partitions must be a whole number from 1 to "
                         f"{MAX_ENGINE_PARTITIONS}, got {count!r}: it is the most engine "
                         "workers the namespace can use")
    return count


@dataclass
class NamespaceProperties:
    """``max_commands_per_second``: engine commands (receives, settlements,
    peeks, counts...) the namespace's engine workers accept per second, all
    clients together; more are answered ``ServerBusy``. None: no limit.

    ``engine_partitions``: the partitions of the namespace's engine (of its
    commands topic), fixed when the namespace is made; at most that many
    engine workers share its work. Read from Kafka, never stored here."""

    name: str
    max_commands_per_second: int | None = None
    updated_at_utc: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    engine_partitions: int = DEFAULT_ENGINE_PARTITIONS

    def to_json(self) -> bytes:
        return definition_json("namespace", self, leave_out=("engine_partitions",))
