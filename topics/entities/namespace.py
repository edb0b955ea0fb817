"""A namespace's own settings, as ``azure.servicebus.management``'s
``NamespaceProperties``: here, the limit on engine commands per second.

They are one record of the namespace's entities topic, beside the entity
definitions, so every engine worker follows them the way it follows queue
policies (``streams.definitions``) and a change needs no restart. Its key,
:data:`NAMESPACE_KEY`, starts with ``$``, which no entity name may, so it
cannot collide with a queue or a topic.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from topics.entities.json_form import definition_json

#: the key of the namespace's record on the entities topic
NAMESPACE_KEY = "$namespace"


@dataclass
class NamespaceProperties:
    """``max_commands_per_second``: engine commands (receives, settlements,
    peeks, counts...) the namespace's engine workers accept per second, all
    clients together; more are answered ``ServerBusy``. None: no limit."""

    name: str
    max_commands_per_second: int | None = None
    updated_at_utc: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))

    def to_json(self) -> bytes:
        return definition_json("namespace", self)
