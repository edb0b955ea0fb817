"""Commands as they are written on the wire, for tests.

The window tests build theirs from wire fields through the engine's own
decoder; the bad-input and rights tests send what no typed record lets a
client write (unknown operations, forged engine operations, bad fields).
"""

from __future__ import annotations

import json
import uuid
from concurrent.futures import Future
from typing import Any

from settlement._engine_link import EngineLink
from topics import names
from topics.commands import (
    VERSION,
    ClientArgs,
    Command,
    Reply,
    ReplyAddress,
    decode_command,
)
from topics.partitions import command_partition


def raw_command(op: str, cmd_id: str, entity: str, partition: int, fields: dict[str, Any],
                reply: ReplyAddress | None = None) -> bytes:
    """A command record with these fields, valid or not."""
    return json.dumps({
        "v": VERSION, "id": cmd_id, "op": op, "entity": entity, "partition": partition,
        "reply": None if reply is None else {"partition": reply.partition,
                                              "client": reply.client},
        **fields}).encode()


def wire_command(op: str, cmd_id: str, **fields: Any) -> Command[ClientArgs]:
    """A client's command on window ``q#0``, as the engine decodes it."""
    return decode_command(raw_command(op, cmd_id, "q", 0, fields))


def call_raw(link: EngineLink, op: str, entity: str, partition: int, **fields: Any) -> Reply:
    """Send a command record as written through ``link``, and its answer."""
    cmd_id = uuid.uuid4().hex
    answer: Future[Reply] = Future()
    with link._lock:
        link._waiting[cmd_id] = answer
    key = f"{entity}#{partition}"
    producer = link._lane().producer  # this thread's
    producer.produce(
        names.commands(link.settings.namespace),
        raw_command(op, cmd_id, entity, partition, fields,
                    ReplyAddress(link.reply_partition, link.client_id)),
        key=key.encode(), partition=command_partition(key, link._engine_partitions))
    assert producer.flush(10) == 0
    return answer.result(30)
