"""The command format rejects malformed records with a reason."""

from __future__ import annotations

import json
import uuid

import pytest

from topics.commands import (
    Command,
    CommandError,
    ReplyAddress,
    decode_command,
    encode_command,
    lock_token,
)


def test_command_round_trip() -> None:
    cmd = Command("id1", "acquire", "orders", 2, ReplyAddress(3, "client"),
                  {"sub": "active", "mode": "peek_lock", "max": 10, "hw": 7})
    assert decode_command(encode_command(cmd)) == cmd


@pytest.mark.parametrize("raw, fragment", [
    (b"\x00\xff garbage", "not JSON"),
    (b"[1, 2]", "JSON object"),
    (json.dumps({"v": 9, "id": "x", "op": "acquire"}).encode(), "version"),
    (json.dumps({"v": 1, "id": "x", "op": "explode", "entity": "q", "partition": 0}).encode(),
     "unknown operation"),
    (json.dumps({"v": 1, "id": "x", "op": "acquire", "entity": "q", "partition": -1}).encode(),
     "partition"),
    (json.dumps({"v": 1, "id": "x", "op": "settle", "entity": "q", "partition": 0,
                 "items": [[0, "t", "vanish", None, None]]}).encode(), "action"),
])
def test_malformed_commands_are_rejected_with_a_reason(raw: bytes, fragment: str) -> None:
    with pytest.raises(CommandError, match=fragment):
        decode_command(raw)


def test_rejection_keeps_the_reply_address_when_readable() -> None:
    raw = json.dumps({"v": 1, "id": "abc", "op": "nope", "reply": {"partition": 1,
                                                                 "client": "me"}}).encode()
    with pytest.raises(CommandError) as info:
        decode_command(raw)
    assert info.value.command_id == "abc" and info.value.reply == ReplyAddress(1, "me")


def test_lock_tokens_are_keyed_uuid4s() -> None:
    secret, other = b"k" * 16, b"o" * 16
    token = lock_token(secret, 12345, 678)
    assert uuid.UUID(token).version == 4 and lock_token(secret, 12345, 678) == token
    assert len({token, lock_token(other, 12345, 678), lock_token(secret, 12346, 678),
                lock_token(secret, 12345, 679)}) == 4
