"""The agent that answers every command: acquire, settle, expire, stats, drop.

One command record carries a whole batch of offsets, so one Faust event and one
table write serve many messages. A command is finished (and its offset
committable) only once Kafka has acknowledged its events and then the window
state it produced, and only then is it answered: a client that got an answer
can rely on it after any crash of the engine. A command cut short by a crash
is processed again from the commands topic (and retried by its client under
the same command id); its repeated events carry the same command id, which
readers drop as repeats.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from faust.types import EventT, StreamT

from streams import durable_table
from streams.app import app, commands_topic, events_topic, replies_topic, state_topic, windows
from streams.states import Event
from streams.window import InflightWindow
from topics.commands import (
    Command,
    CommandError,
    Reply,
    ReplyAddress,
    command_partition,
    decode_command,
    encode_reply,
)

log = logging.getLogger(__name__)
_pending: asyncio.Queue[tuple[ReplyAddress, Reply]] = asyncio.Queue()
_parsed: dict[bytes, tuple[bytes, InflightWindow]] = {}


@app.agent(commands_topic)
async def process_commands(stream: StreamT) -> None:
    async for event in stream.events():
        try:
            await _handle(event)
        except Exception:  # never let one record stop the engine
            log.exception("command at %s[%d]@%d failed", event.message.topic,
                          event.message.partition, event.message.offset)


async def _handle(event: EventT) -> None:
    try:
        cmd = decode_command(event.value)
    except CommandError as exc:
        log.warning("rejected command at partition %d offset %d: %s",
                    event.message.partition, event.message.offset, exc)
        if exc.reply is not None and exc.command_id:
            _answer(exc.reply, Reply(exc.command_id, exc.reply.client, False,
                                     error_code="BadCommand", error_message=str(exc)))
        return
    key = cmd.window_key.encode()
    partitions = app.consumer.topic_partitions(commands_topic.get_topic_name()) or 0
    if event.key != key or (partitions and event.message.partition
                            != command_partition(cmd.window_key, partitions)):
        _reject(cmd, "Misrouted", f"command for window {cmd.window_key} must be keyed by it "
                f"and sent to partition {command_partition(cmd.window_key, partitions or 1)}")
        return
    if cmd.op == "drop":
        _parsed.pop(key, None)
        await durable_table.delete(windows, key)
        _reply_ok(cmd, {})
        return
    window = _load(key, cmd)
    if window is None:
        return
    try:
        outcome = window.apply(cmd, int(time.time() * 1000))
    except Exception:
        _parsed.pop(key, None)  # the object may be half-changed; reload from the table
        raise
    if outcome.changed:
        # Events are acknowledged by Kafka before the changelog record is even
        # queued: a crash that kept the new state but lost its events would
        # lose them for good (the retried command replays its answer and
        # publishes nothing). Queueing them first is not enough on a cluster:
        # the events' and the changelog's partitions may have different
        # leaders, and either request may land first. Events without their
        # state are published again by the retry under the same command id,
        # which readers drop as a repeat.
        await _publish(window, outcome.events, cmd.id)
        stored = window.to_bytes()
        _parsed[key] = (stored, window)
        await durable_table.put(windows, key, stored)
    _reply_ok(cmd, outcome.result)


def _load(key: bytes, cmd: Command) -> InflightWindow | None:
    """The window as stored in the table, parsed once: the parsed object is
    reused while the table still holds exactly the bytes it was stored as."""
    raw = windows.get(key)
    cached = _parsed.get(key)
    if cached is not None and raw is not None and cached[0] == raw:
        return cached[1]
    try:
        return InflightWindow.from_bytes(raw) if raw else InflightWindow(cmd.entity,
                                                                         cmd.partition)
    except (ValueError, KeyError, TypeError) as exc:
        log.error("window %s is unreadable (%s); leaving it untouched", cmd.window_key, exc)
        _reject(cmd, "StateUnreadable", f"the engine cannot read the state of {cmd.window_key}")
        return None


async def _publish(window: InflightWindow, events: list[Event], command_id: str) -> None:
    """Settlement events (one record per kind) and the window's new summary,
    returning once Kafka has acknowledged them.

    Each event names the command that caused it: a command processed again
    after a crash (before its state was flushed) publishes its events again,
    and readers drop those repeats by (cmd, type, entity, partition)."""
    now = int(time.time() * 1000)
    key = f"{window.entity}#{window.partition}".encode()
    sent = []
    for ev in events:
        record: dict[str, Any] = {"type": ev.type, "entity": window.entity,
                                  "partition": window.partition, "offsets": ev.offsets,
                                  "count": ev.count, "ts": now, "cmd": command_id, **ev.extra}
        sent.append(await events_topic.send(key=key, value=json.dumps(record).encode()))
    sent.append(await state_topic.send(
        key=key, value=json.dumps({**window.summary(), "ts": now}).encode()))
    await asyncio.gather(*sent)  # acknowledged (acks=all), or an error for the caller


def _reply_ok(cmd: Command, result: dict[str, Any]) -> None:
    if cmd.reply is not None:
        _answer(cmd.reply, Reply(cmd.id, cmd.reply.client, True, result))


def _reject(cmd: Command, code: str, message: str) -> None:
    log.warning("command %s (%s on %s): %s", cmd.id, cmd.op, cmd.window_key, message)
    if cmd.reply is not None:
        _answer(cmd.reply, Reply(cmd.id, cmd.reply.client, False,
                                 error_code=code, error_message=message))


def _answer(address: ReplyAddress, reply: Reply) -> None:
    _pending.put_nowait((address, reply))


@app.task
async def send_replies() -> None:
    """Answer in batches: every reply that queued meanwhile goes out together.
    Each was queued after the state it reports was acknowledged."""
    while True:
        batch = [await _pending.get()]
        while not _pending.empty():
            batch.append(_pending.get_nowait())
        try:
            for address, reply in batch:
                await replies_topic.send(key=reply.client.encode(), value=encode_reply(reply),
                                         partition=address.partition)
        except Exception:
            log.exception("could not answer %d commands; their senders will retry", len(batch))
