"""The ``settlement`` command line, run in-process through ``main([...])``.

Uses the session fixtures of ``conftest.py``: ``conn`` (a namespace with a
running engine worker) and ``queue_name`` (a unique name, not yet created;
the topic tests use it as the topic's name).
"""

from __future__ import annotations

import datetime as dt
import io
import json

import pytest

from settlement import ServiceBusClient, ServiceBusMessage
from settlement.cli import build_parser, main
from settlement.cli.admin import correlation_filter, entity_options
from settlement.cli.base import ENV_CONNECTION_STRING, UsageError
from settlement.management import CorrelationRuleFilter

COMMANDS = [
    [], ["broker"], ["worker"], ["send"], ["receive"], ["dlq"],
    *([group, *command] for group in ("queue", "topic", "subscription", "rule")
      for command in ([], ["create"], ["list"], ["show"], ["delete"])),
    ["queue", "sessions"], ["subscription", "sessions"], ["queue", "update"],
    ["topic", "update"], ["namespace"], ["namespace", "create"], ["namespace", "show"],
    ["namespace", "set"],
    ["peek"], ["dlq", "list"], ["dlq", "purge"],
]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()  # drop what earlier calls printed
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def shown(out: str) -> dict[str, str]:
    """``queue show`` output as a dict."""
    return dict(line.split(maxsplit=1) for line in out.splitlines() if line.strip())


def message_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("seq=")]


def received(out: str) -> dict[str, dict[str, object]]:
    """``receive`` output: the application properties of each message id."""
    found = {}
    for line in message_lines(out):
        fields = dict(part.split("=", 1) for part in line.split(" ")
                      if part.startswith(("id=", "properties=")))
        found[fields["id"]] = json.loads(fields["properties"])
    return found


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "settlement")
def test_help_for_every_command(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, *command, "--help")
    assert code == 0
    assert out.startswith(f"usage: {' '.join(['settlement', *command])}")


def test_queue_create_then_list(conn: str, queue_name: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "queue", "create", queue_name, "--connection-string", conn,
                         "--lock-duration", "5", "--max-delivery-count", "4",
                         "--partitions", "2")
    assert code == 0, err
    assert queue_name in out

    code, out, err = run(capsys, "queue", "list", "--connection-string", conn)
    assert code == 0, err
    row = next(line.split() for line in out.splitlines() if line.startswith(queue_name + " "))
    assert row[:4] == [queue_name, "2", "5s", "4"]


def test_send_then_receive_complete(conn: str, queue_name: str,
                                    capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_CONNECTION_STRING, conn)  # no --connection-string from here on
    assert run(capsys, "queue", "create", queue_name)[0] == 0
    code, out, err = run(capsys, "send", queue_name, "hello cli", "--message-id", "m-1",
                         "--property", "kind=test", "--property", "n=3")
    assert code == 0, err
    assert "sent 1 message" in out

    code, out, err = run(capsys, "queue", "show", queue_name)
    assert code == 0, err
    assert shown(out)["active_message_count"] == "1"

    code, out, err = run(capsys, "receive", queue_name, "--max", "5", "--wait", "15",
                         "--settle", "complete")
    assert code == 0, err
    [line] = message_lines(out)
    assert "delivery=0" in line and "id=m-1" in line and "'hello cli'" in line
    assert line.endswith("settled=completed")

    code, out, err = run(capsys, "receive", queue_name, "--wait", "1")
    assert code == 0, err
    assert message_lines(out) == []
    assert "received 0 message(s)" in err


def test_dead_letter_then_dlq(conn: str, queue_name: str,
                              capsys: pytest.CaptureFixture[str]) -> None:
    cs = ["--connection-string", conn]
    assert run(capsys, "queue", "create", queue_name, *cs)[0] == 0
    assert run(capsys, "send", queue_name, "poison", "--message-id", "bad-1", *cs)[0] == 0

    code, out, err = run(capsys, "receive", queue_name, "--wait", "15", "--settle",
                         "dead-letter", "--reason", "BadPayload", "--description",
                         "cannot parse", *cs)
    assert code == 0, err
    [line] = message_lines(out)
    assert "id=bad-1" in line and line.endswith("settled=dead-lettered")

    for _ in range(2):  # dlq leaves the messages where they are
        code, out, err = run(capsys, "dlq", queue_name, *cs)
        assert code == 0, err
        [line] = message_lines(out)
        assert "reason=BadPayload" in line and "description=cannot parse" in line
        assert "id=bad-1" in line and "'poison'" in line

    code, out, err = run(capsys, "queue", "show", queue_name, *cs)
    assert code == 0, err
    counts = shown(out)
    assert counts["dead_letter_message_count"] == "1"
    assert counts["active_message_count"] == "0"
    assert counts["locked_message_count"] == "0"


def test_send_count_then_receive_and_delete(conn: str, queue_name: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    cs = ["--connection-string", conn]
    assert run(capsys, "queue", "create", queue_name, "--partitions", "2", *cs)[0] == 0
    code, out, err = run(capsys, "send", queue_name, "a", "b", "--count", "75", *cs)
    assert code == 0, err
    assert "sent 150 message(s)" in out
    assert "150/150" in err  # the progress bar

    code, out, err = run(capsys, "receive", queue_name, "--mode", "receive-and-delete",
                         "--max", "500", "--wait", "15", *cs)
    assert code == 0, err
    lines = message_lines(out)
    assert len(lines) == 150
    assert all(line.endswith("settled=deleted-on-receipt") for line in lines)
    assert run(capsys, "receive", queue_name, "--wait", "1", *cs)[1] == ""


def test_missing_connection_string(capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_CONNECTION_STRING, raising=False)
    code, out, err = run(capsys, "queue", "list")
    assert code == 2
    assert err.startswith("error: ")
    assert "--connection-string" in err and ENV_CONNECTION_STRING in err


def test_bad_connection_string(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "queue", "list", "--connection-string", "Endpoint=http://x")
    assert code == 2
    assert err.startswith("error: ") and "kafka://" in err


def test_queue_show_unknown_queue(conn: str, queue_name: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "queue", "show", queue_name, "--connection-string", conn)
    assert code == 2
    assert out == ""
    assert err.startswith("error: ") and queue_name in err


def test_settle_option_mistakes(conn: str, queue_name: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    cs = ["--connection-string", conn]
    code, _, err = run(capsys, "receive", queue_name, "--reason", "R", *cs)
    assert code == 2 and "--settle dead-letter" in err
    code, _, err = run(capsys, "receive", queue_name, "--dead-letter", "--settle",
                       "dead-letter", *cs)
    assert code == 2 and "dead-letter sub-queue" in err
    code, _, err = run(capsys, "receive", queue_name, "--mode", "receive-and-delete",
                       "--settle", "abandon", *cs)
    assert code == 2 and "deleted on receipt" in err


def test_queue_create_with_lifecycle_options_and_show(conn: str, queue_name: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    cs = ("--connection-string", conn)
    code, _, err = run(capsys, "queue", "create", queue_name, "--default-ttl", "30",
                       "--dead-letter-on-expiration", "--duplicate-detection", "60", *cs)
    assert code == 0, err
    code, out, err = run(capsys, "queue", "show", queue_name, *cs)
    assert code == 0, err
    fields = shown(out)
    assert fields["requires_duplicate_detection"] == "True"
    assert fields["dead_lettering_on_message_expiration"] == "True"
    assert fields["scheduled_message_count"] == "0" and fields["total_message_count"] == "0"


def test_queue_and_topic_update_change_the_size_quota(conn: str, queue_name: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    cs = ("--connection-string", conn)
    topic = f"{queue_name}-t"
    assert run(capsys, "queue", "create", queue_name, "--max-size-in-megabytes", "5", *cs)[0] == 0
    assert run(capsys, "topic", "create", topic, "--max-size-in-megabytes", "6", *cs)[0] == 0
    code, out, err = run(capsys, "queue", "update", queue_name, "--max-size-in-megabytes", "7",
                         "--max-delivery-count", "3", *cs)
    assert code == 0, err
    assert "max_size_in_megabytes=7" in out and "max_delivery_count=3" in out
    assert shown(run(capsys, "queue", "show", queue_name, *cs)[1])["max_size_in_megabytes"] == "7"
    assert run(capsys, "topic", "update", topic, "--max-size-in-megabytes", "8", *cs)[0] == 0
    assert shown(run(capsys, "topic", "show", topic, *cs)[1])["max_size_in_megabytes"] == "8"
    code, _, err = run(capsys, "queue", "update", queue_name, "--max-size-in-megabytes", "0", *cs)
    assert code == 2 and "max_size_in_megabytes" in err
    code, _, err = run(capsys, "topic", "update", topic, *cs)
    assert code == 2 and "nothing to change" in err


def test_namespace_set_and_show_the_command_limit(conn: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    cs = ("--connection-string", conn)
    try:  # high enough that nothing running beside this test notices
        code, out, err = run(capsys, "namespace", "set", "--max-commands-per-second", "50000",
                             *cs)
        assert code == 0, err
        assert shown(out)["max_commands_per_second"] == "50000"
        assert shown(run(capsys, "namespace", "show", *cs)[1])["max_commands_per_second"] \
            == "50000"
    finally:
        code, out, err = run(capsys, "namespace", "set", "--max-commands-per-second", "none",
                             *cs)
    assert code == 0, err
    assert shown(out)["max_commands_per_second"] == "none"
    code, _, err = run(capsys, "namespace", "set", "--max-commands-per-second", "many", *cs)
    assert code == 2 and "whole number or 'none'" in err


# ------------------------------------------------------- topics, subscriptions, rules
def make_topic(capsys: pytest.CaptureFixture[str], conn: str, topic: str,
               subscription: str = "s") -> None:
    """Create ``topic`` with one subscription (its ``$Default`` rule takes everything)."""
    cs = ["--connection-string", conn]
    assert run(capsys, "topic", "create", topic, *cs)[0] == 0
    assert run(capsys, "subscription", "create", topic, subscription, *cs)[0] == 0


def order_args(topic: str, message_id: str, region: str, amount: int) -> list[str]:
    return ["send", topic, f"order {message_id}", "--message-id", message_id,
            "--property", f"region={region}", "--property", f"amount={amount}"]


def test_topic_subscriptions_and_sql_rules_route_what_send_publishes(
        conn: str, queue_name: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_CONNECTION_STRING, conn)
    topic = queue_name
    code, out, err = run(capsys, "topic", "create", topic, "--partitions", "2")
    assert code == 0, err
    assert f"created topic {topic!r}" in out and "partition_count=2" in out
    for sub in ("eu", "big"):
        code, out, err = run(capsys, "subscription", "create", topic, sub, "--lock-duration",
                             "5", "--max-delivery-count", "3")
        assert code == 0, err
        assert f"'{topic}/subscriptions/{sub}'" in out and "lock_duration=5s" in out
    code, _, err = run(capsys, "rule", "create", topic, "eu", "in-eu", "--sql",
                       "region = 'eu'")
    assert code == 0, err
    assert "'$Default' still selects every message" in err  # the hint
    code, _, err = run(capsys, "rule", "create", topic, "big", "big", "--sql", "amount >= 100",
                       "--action", "SET priority = 'high'")
    assert code == 0, err
    for sub in ("eu", "big"):
        assert run(capsys, "rule", "delete", topic, sub, "$Default")[0] == 0
    code, out, err = run(capsys, "rule", "list", topic, "big")
    assert code == 0, err
    [row] = out.splitlines()[2:]
    assert row.split(None, 1) == ["big", "sql: amount >= 100  SET priority = 'high'"]

    for message_id, region, amount in [("o1", "eu", 50), ("o2", "us", 150),
                                       ("o3", "eu", 500), ("o4", "us", 20)]:
        code, out, err = run(capsys, *order_args(topic, message_id, region, amount))
        assert code == 0, err
        assert out.strip() == f"sent 1 message(s) to topic {topic!r}"

    code, out, err = run(capsys, "topic", "show", topic)
    assert code == 0, err
    fields = shown(out)
    assert fields["subscription_count"] == "2" and fields["subscriptions"] == "big, eu"
    code, out, err = run(capsys, "subscription", "show", topic, "eu")
    assert code == 0, err
    fields = shown(out)
    assert fields["path"] == f"{topic}/subscriptions/eu" and fields["rules"] == "in-eu"
    assert fields["active_message_count"] == "2" and fields["max_delivery_count"] == "3"

    code, out, err = run(capsys, "receive", f"{topic}/subscriptions/eu", "--max", "10",
                         "--wait", "15")
    assert code == 0, err
    assert received(out) == {"o1": {"region": "eu", "amount": 50},
                             "o3": {"region": "eu", "amount": 500}}
    code, out, err = run(capsys, "receive", f"{topic}/subscriptions/big", "--max", "10",
                         "--wait", "15")
    assert code == 0, err
    assert received(out) == {"o2": {"region": "us", "amount": 150, "priority": "high"},
                             "o3": {"region": "eu", "amount": 500, "priority": "high"}}
    code, out, err = run(capsys, "subscription", "show", topic, "big")
    assert code == 0, err
    assert shown(out)["total_message_count"] == "0"

    code, out, err = run(capsys, "subscription", "delete", topic, "eu")
    assert code == 0, err
    code, out, err = run(capsys, "subscription", "list", topic)
    assert code == 0, err
    assert [line.split()[0] for line in out.splitlines()[2:]] == ["big"]
    code, out, err = run(capsys, "topic", "delete", topic)
    assert code == 0, err
    assert out.strip() == f"deleted topic {topic!r} with its subscriptions"
    code, out, _ = run(capsys, "topic", "list")
    assert code == 0 and topic not in out
    code, _, err = run(capsys, "topic", "show", topic)
    assert code == 2 and f"'settlement topic create {topic}'" in err


def test_rule_create_refuses_invalid_sql_with_its_position(
        conn: str, queue_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    cs = ["--connection-string", conn]
    make_topic(capsys, conn, queue_name)
    code, out, err = run(capsys, "rule", "create", queue_name, "s", "bad", "--sql",
                         "amount >>= 100", *cs)
    assert code == 2 and out == ""
    lines = err.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("error: "))
    first, source, caret = lines[at:at + 3]
    assert first.startswith("error: the SQL filter of rule 'bad' is invalid: ")
    assert "line 1, column 9" in first
    assert source.strip() == "amount >>= 100" and caret.index("^") == source.index(">=")
    assert "Traceback" not in err

    code, _, err = run(capsys, "rule", "create", queue_name, "s", "bad", "--true",
                       "--action", "SET sys.label = 'x'", *cs)
    assert code == 2
    assert err.startswith("error: the SQL action of rule 'bad' is invalid: ")
    code, out, err = run(capsys, "rule", "list", queue_name, "s", *cs)
    assert code == 0, err
    assert [line.split()[0] for line in out.splitlines()[2:]] == ["$Default"]


def test_correlation_rule_selects_by_subject_and_property(
        conn: str, queue_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    cs = ["--connection-string", conn]
    make_topic(capsys, conn, queue_name)
    code, _, err = run(capsys, "rule", "create", queue_name, "s", "eu-orders", "--correlation",
                       "subject=order", "--correlation", "region=eu", *cs)
    assert code == 0, err
    assert run(capsys, "rule", "delete", queue_name, "s", "$Default", *cs)[0] == 0
    code, out, err = run(capsys, "rule", "show", queue_name, "s", "eu-orders", *cs)
    assert code == 0, err
    assert shown(out)["filter"] == "correlation: subject='order', region='eu'"

    for body, subject, region in [("a", "order", "eu"), ("b", "refund", "eu"),
                                  ("c", "order", "us")]:
        assert run(capsys, "send", queue_name, body, "--message-id", body, "--subject", subject,
                   "--property", f"region={region}", *cs)[0] == 0
    code, out, err = run(capsys, "receive", f"{queue_name}/subscriptions/s", "--max", "5",
                         "--wait", "15", *cs)
    assert code == 0, err
    assert list(received(out)) == ["a"]


def test_dlq_of_a_subscription_lists_and_purges_but_refuses_resubmit(
        conn: str, queue_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    cs = ["--connection-string", conn]
    path = f"{queue_name}/subscriptions/s"
    make_topic(capsys, conn, queue_name)
    assert run(capsys, "send", queue_name, "poison", "--message-id", "p-1", *cs)[0] == 0
    code, out, err = run(capsys, "receive", path, "--wait", "15", "--settle", "dead-letter",
                         "--reason", "BadPayload", *cs)
    assert code == 0, err
    assert message_lines(out)[0].endswith("settled=dead-lettered")

    code, out, err = run(capsys, "dlq", path, *cs)
    assert code == 0, err
    [line] = message_lines(out)
    assert "reason=BadPayload" in line and "id=p-1" in line
    code, _, err = run(capsys, "dlq", "resubmit", path, *cs)
    assert code == 2
    assert "has no log of its own" in err and "every subscription" in err
    code, out, err = run(capsys, "dlq", "purge", path, "--yes", *cs)
    assert code == 0, err
    assert f"purged 1 dead letter(s) of {path!r}" in out
    code, out, err = run(capsys, "subscription", "show", queue_name, "s", *cs)
    assert code == 0, err
    assert shown(out)["dead_letter_message_count"] == "0"


def test_send_and_receive_say_what_to_use_instead(
        conn: str, queue_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    cs = ["--connection-string", conn]
    code, _, err = run(capsys, "send", queue_name, "x", *cs)
    assert code == 2
    assert f"'settlement queue create {queue_name}'" in err
    assert f"'settlement topic create {queue_name}'" in err
    make_topic(capsys, conn, queue_name)
    code, _, err = run(capsys, "send", f"{queue_name}/subscriptions/s", "x", *cs)
    assert code == 2 and f"send to its topic {queue_name!r}" in err
    for command in (["receive", queue_name], ["dlq", queue_name]):
        code, _, err = run(capsys, *command, *cs)
        assert code == 2 and f"'{queue_name}/subscriptions/SUB'" in err


def test_session_queue_send_list_sessions_and_receive_next(
        conn: str, queue_name: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_CONNECTION_STRING, conn)
    assert run(capsys, "queue", "create", queue_name, "--requires-session")[0] == 0
    assert shown(run(capsys, "queue", "show", queue_name)[1])["requires_session"] == "True"
    code, _, err = run(capsys, "send", queue_name, "a", "b", "--session-id", "cart-7")
    assert code == 0, err
    code, out, err = run(capsys, "queue", "sessions", queue_name)
    assert code == 0, err
    assert out.splitlines()[2].split()[:3] == ["cart-7", "2", "-"]
    code, out, err = run(capsys, "receive", queue_name, "--session", "next", "--max", "5")
    assert code == 0, err
    assert [line.split("body=")[1].split()[0] for line in message_lines(out)] == ["'a'", "'b'"]
    code, _, err = run(capsys, "queue", "sessions", queue_name)
    assert code == 0 and f"no sessions in queue {queue_name!r}" in err


def test_correlation_keys_name_system_or_application_properties() -> None:
    assert correlation_filter(["subject=order", "amount=100", "user.to=x", "sys.to=y"]) == (
        CorrelationRuleFilter(subject="order", to="y", properties={"amount": 100, "to": "x"}))
    with pytest.raises(UsageError, match="user.nope"):
        correlation_filter(["sys.nope=1"])
    with pytest.raises(UsageError, match="KEY=VALUE"):
        correlation_filter(["subject"])


def test_create_options_map_to_the_administration_keywords() -> None:
    args = build_parser().parse_args(["queue", "create", "q", "--duplicate-detection",
                                      "--lock-duration", "5", "--forward-to", "other"])
    assert entity_options(args) == {
        "lock_duration": 5.0, "forward_to": "other", "requires_duplicate_detection": True,
        "duplicate_detection_history_time_window": 600.0}
    args = build_parser().parse_args(["subscription", "create", "t", "s",
                                      "--no-dead-letter-on-filter-errors"])
    assert entity_options(args) == {"dead_lettering_on_filter_evaluation_exceptions": False}


# ------------------------------------------------------------------ for scripts
class Terminal(io.StringIO):
    """Standard input that is a terminal, with what the user types."""

    def isatty(self) -> bool:
        return True


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    code, out, err = run(capsys, *argv, "--output", "json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.tansu
def test_lists_and_shows_print_json(conn: str, queue_name: str,
                                    capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_CONNECTION_STRING, conn)
    assert run(capsys, "queue", "create", queue_name, "--lock-duration", "5")[0] == 0
    make_topic(capsys, conn, f"{queue_name}-t")
    queues = run_json(capsys, "queue", "list")
    assert isinstance(queues, list)
    [queue] = [q for q in queues if q["name"] == queue_name]
    assert queue["lock_duration"] == 5.0 and queue["requires_session"] is False
    dt.datetime.fromisoformat(queue["created_at_utc"])
    shown_queue = run_json(capsys, "queue", "show", queue_name)
    assert isinstance(shown_queue, dict)
    assert shown_queue["name"] == queue_name and shown_queue["active_message_count"] == 0
    [rule] = run_json(capsys, "rule", "list", f"{queue_name}-t", "s")  # type: ignore[misc]
    assert rule["name"] == "$Default" and rule["filter"]["sql_expression"] == "1=1"
    assert run_json(capsys, "queue", "sessions", queue_name) == []
    assert run_json(capsys, "subscription", "show", f"{queue_name}-t", "s")[  # type: ignore[index]
        "rules"] == ["$Default"]


@pytest.mark.tansu
def test_send_reads_stdin_with_message_options_and_peek_shows_every_state(
        conn: str, queue_name: str, client: ServiceBusClient,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_CONNECTION_STRING, conn)
    assert run(capsys, "queue", "create", queue_name)[0] == 0
    assert run(capsys, "send", queue_name, "defer me", "--message-id", "d")[0] == 0
    code, out, err = run(capsys, "receive", queue_name, "--settle", "defer", "--wait", "15")
    assert code == 0 and "id=d" in out and out.rstrip().endswith("settled=deferred"), err
    monkeypatch.setattr("sys.stdin", io.StringIO("first line\nsecond line\n"))
    code, out, err = run(capsys, "send", queue_name, "--message-id", "m", "--ttl", "3600",
                         "--session-id", "cart-1", "--property", "n=3",
                         "--property", "kind=order")
    assert code == 0, err
    assert "sent 2 message(s)" in out
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).replace(microsecond=0)
    code, _, err = run(capsys, "send", queue_name, "later", "--message-id", "s",
                       "--scheduled-at", later.replace(tzinfo=None).isoformat())  # naive: UTC
    assert code == 0, err
    with client.get_queue_sender(queue_name) as sender:
        sender.send_messages(ServiceBusMessage(b"\xff\x00", message_id="binary"))

    peeked = run_json(capsys, "peek", queue_name, "--max", "10")
    assert isinstance(peeked, list)
    by_id = {m["message_id"]: m for m in peeked}
    assert {i: m["state"] for i, m in by_id.items()} == {
        "d": "DEFERRED", "m-0": "ACTIVE", "m-1": "ACTIVE", "s": "SCHEDULED",
        "binary": "ACTIVE"}
    for message_id, body in [("m-0", "first line"), ("m-1", "second line")]:
        message = by_id[message_id]
        assert (message["body"], message["body_encoding"]) == (body, "utf-8")
        assert message["session_id"] == "cart-1" and message["time_to_live"] == 3600.0
        assert message["application_properties"] == {"n": 3, "kind": "order"}
    assert dt.datetime.fromisoformat(by_id["s"]["scheduled_enqueue_time_utc"]) == later
    assert (by_id["binary"]["body"], by_id["binary"]["body_encoding"]) == ("/wA=", "base64")
    assert "dead_letter_reason" not in by_id["d"]

    code, out, err = run(capsys, "peek", queue_name, "--max", "10")
    assert code == 0, err
    states = {line.split(" id=")[1].split()[0]: line.split(" state=")[1].split()[0]
              for line in message_lines(out)}
    assert states == {"d": "DEFERRED", "m-0": "ACTIVE", "m-1": "ACTIVE", "s": "SCHEDULED",
                      "binary": "ACTIVE"}
    assert "5 message(s)" in err

    received_json = run_json(capsys, "receive", queue_name, "--max", "3", "--wait", "15")
    assert isinstance(received_json, list)
    assert sorted(m["message_id"] for m in received_json) == ["binary", "m-0", "m-1"]
    assert {m["settled"] for m in received_json} == {"completed"}
    assert all(m["delivery_count"] == 0 for m in received_json)


@pytest.mark.tansu
def test_dlq_purge_asks_first_and_refuses_without_a_terminal_unless_yes(
        conn: str, queue_name: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_CONNECTION_STRING, conn)
    assert run(capsys, "queue", "create", queue_name)[0] == 0
    assert run(capsys, "send", queue_name, "a", "b", "--message-id", "p")[0] == 0
    code, out, err = run(capsys, "receive", queue_name, "--max", "2", "--wait", "15",
                         "--settle", "dead-letter", "--reason", "Bad")
    assert code == 0 and len(message_lines(out)) == 2, err

    def dead_letters() -> list[object]:
        peeked = run_json(capsys, "dlq", "list", queue_name)
        assert isinstance(peeked, list)
        return peeked

    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))  # a pipe: nobody to ask
    code, out, err = run(capsys, "dlq", "purge", queue_name)
    assert code == 2 and out == ""
    assert f"not deleting 2 dead letter(s) of {queue_name!r}" in err and "--yes" in err
    monkeypatch.setattr("sys.stdin", Terminal("n\n"))
    code, _, err = run(capsys, "dlq", "purge", queue_name)
    assert code == 1
    assert f"Delete 2 dead letters of {queue_name!r}? [y/N]" in err and "nothing deleted" in err
    assert len(dead_letters()) == 2
    assert {m["dead_letter_reason"] for m in dead_letters()} == {"Bad"}  # type: ignore[index]

    monkeypatch.setattr("sys.stdin", Terminal("y\n"))
    code, out, err = run(capsys, "dlq", "purge", queue_name)
    assert code == 0 and "purged 2 dead letter(s)" in out, err
    assert dead_letters() == []
    assert run(capsys, "send", queue_name, "c")[0] == 0
    assert run(capsys, "receive", queue_name, "--wait", "15", "--settle", "dead-letter")[0] == 0
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    code, out, err = run(capsys, "dlq", "purge", queue_name, "--yes")
    assert code == 0 and "purged 1 dead letter(s)" in out, err
