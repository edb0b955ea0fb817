"""The ``settlement`` command line, run in-process through ``main([...])``.

Uses the session fixtures of ``conftest.py``: ``conn`` (a namespace with a
running engine worker) and ``queue_name`` (a unique name, not yet created).
"""

from __future__ import annotations

import pytest

from settlement.cli import ENV_CONNECTION_STRING, main

COMMANDS = [
    [], ["broker"], ["worker"], ["queue"], ["queue", "create"], ["queue", "list"],
    ["queue", "show"], ["queue", "delete"], ["send"], ["receive"], ["dlq"],
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
    assert "delivery=1" in line and "id=m-1" in line and "'hello cli'" in line
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
