"""A batch of messages sent in one call, bounded by the entity's size limit."""

from __future__ import annotations

from settlement.exceptions import MessageSizeExceededError
from settlement.message import Sendable, ServiceBusMessage, sendable
from settlement.message_records import record_size


class ServiceBusMessageBatch:
    """Messages sent together; ``add_message`` refuses what would not fit."""

    def __init__(self, max_size_in_bytes: int) -> None:
        self.max_size_in_bytes = max_size_in_bytes
        self._messages: list[ServiceBusMessage] = []
        self._size = 0

    def add_message(self, message: Sendable) -> None:
        message = sendable(message)
        size = record_size(message)
        if self._size + size > self.max_size_in_bytes:
            raise MessageSizeExceededError(
                f"the batch holds {self._size} of {self.max_size_in_bytes} bytes and this "
                f"message needs {size}: send this batch and start a new one"
            )
        self._messages.append(message)
        self._size += size

    @property
    def size_in_bytes(self) -> int:
        return self._size

    def __len__(self) -> int:
        return len(self._messages)

    @property
    def messages(self) -> list[ServiceBusMessage]:
        return list(self._messages)
