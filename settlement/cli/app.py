"""``settlement``: run a broker or an engine worker, manage queues, topics,
subscriptions and rules, send and receive.

Every command that talks to a namespace takes ``--connection-string`` (or the
``SETTLEMENT_CONNECTION_STRING`` environment variable)::

    settlement broker --port 9092              # Apache Kafka, its data in data/broker
    settlement broker --tansu --port 9092      # Tansu instead: no JVM, memory only
    settlement kafka --port 9092 --brokers 3   # Apache Kafka of three nodes
    settlement kafka --port 9093 --tls         # with TLS: prints 'ca: PATH' for CaFile=PATH
    settlement worker --connection-string "Endpoint=kafka://127.0.0.1:9092;Namespace=dev"
    export SETTLEMENT_CONNECTION_STRING="Endpoint=kafka://127.0.0.1:9092;Namespace=dev"
    settlement queue create orders --lock-duration 30 --max-delivery-count 5
    settlement send orders '{"id": 1}' --property kind=order
    seq 1000 | settlement send orders --ttl 3600 --session-id s1   # bodies from stdin
    settlement receive orders --max 10 --settle complete --output json
    settlement peek orders --max 50        # active, deferred and scheduled, unlocked
    settlement dlq orders
    settlement dlq purge orders --yes
    settlement topic create sales
    settlement subscription create sales eu
    settlement rule create sales eu in-eu --sql "region = 'eu'"
    settlement rule delete sales eu '$Default'
    settlement send sales '{"id": 2}' --property region=eu     # a queue or a topic
    settlement receive sales/subscriptions/eu --max 10

Exit codes: 0 success, 1 some settlement failed (e.g. a lock was lost),
2 usage or service error (printed as ``error: ...`` on stderr). Every list,
show, peek and receive takes ``--output json`` (:mod:`settlement.cli.output`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from tqdm import tqdm

from settlement._entities import EntityRegistry
from settlement._session import NEXT_AVAILABLE_SESSION
from settlement._sign_in import check_connection
from settlement.cli import admin as admin_cli
from settlement.cli import namespace as namespace_cli
from settlement.cli import pair as pair_cli
from settlement.cli.base import (
    ENV_CONNECTION_STRING,
    UsageError,
    add_command,
    add_group,
    admin_client,
    connection_string,
    property_value,
    split_pair,
)
from settlement.cli.broker import run_kafka, run_tansu
from settlement.cli.output import add_output_option, print_messages
from settlement.client import ServiceBusClient
from settlement.dead_letters import purge_dead_letters, resubmit_dead_letters
from settlement.exceptions import MessagingEntityNotFoundError, ServiceBusError
from settlement.message import PropertyValue, ServiceBusMessage, ServiceBusReceivedMessage
from settlement.receiver import ServiceBusReceiveMode, ServiceBusReceiver, ServiceBusSubQueue
from settlement.sender import ServiceBusSender
from settlement.testing.apache_kafka import KAFKA_VERSION
from settlement.testing.tls import make_certificates
from spark import cli as spark_cli
from streams.worker import run_worker
from topics import names, rights
from topics.connection import ConnectionStringError, parse_connection_string
from topics.entities import Definition, QueueProperties, SubscriptionProperties, TopicProperties
from topics.specs import ProvisioningError

log = logging.getLogger(__name__)

#: Where ``settlement broker`` keeps its data unless told (like ``worker``'s ``data/engine``).
BROKER_DATA_DIR = "data/broker"
#: After the first messages arrive, how long a receive keeps draining for more.
DRAIN_WAIT_S = 0.5
#: Messages per ``send_messages`` call.
SEND_CHUNK = 500
#: ``--settle`` choice -> (receiver action, what the output says was done).
SETTLE_ACTIONS = {
    "complete": ("complete", "completed"),
    "abandon": ("abandon", "abandoned"),
    "dead-letter": ("dead_letter", "dead-lettered"),
    "defer": ("defer", "deferred"),
}


# --------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    """The ``settlement`` argument parser, one sub-command per function below."""
    parser = argparse.ArgumentParser(
        prog="settlement",
        description="Service Bus settlement semantics (peek-lock, complete, abandon, "
                    "dead-letter, defer) on Apache Kafka.")
    _add_common(parser, top_level=True)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    _add_common(common, top_level=False)

    broker = commands.add_parser(
        "broker", parents=[common], help="run a broker: Apache Kafka, one node (or --tansu)",
        description="Run one Apache Kafka node (KRaft, its jars fetched from Maven Central "
                    "once) in the foreground until interrupted. Its data lives in --data-dir: "
                    "started again on it, it has every message, lock, dead letter and session "
                    "state it had.")
    broker.add_argument("--port", type=int, default=9092, help="port to listen on "
                        "(default 9092; a data directory keeps the port it was made with)")
    broker.add_argument("--data-dir", default=None,
                        help=f"where the broker keeps its data (default: {BROKER_DATA_DIR})")
    broker.add_argument("--tansu", action="store_true",
                        help="run Tansu instead: no JVM, but every message is kept in memory "
                             "only, and some features need Apache Kafka (see the README)")
    broker.set_defaults(handler=cmd_broker)

    kafka = commands.add_parser(
        "kafka", parents=[common], help="run Apache Kafka from Maven Central (1 or 3 nodes)",
        description="Run Apache Kafka (KRaft) in the foreground until interrupted: its jars "
                    "are fetched with Maven once and cached; storage is formatted once per "
                    "data directory, and a second run on it restarts the same cluster.")
    kafka.add_argument("--port", type=int, default=9092,
                       help="client port of the first node; the others follow (default 9092)")
    kafka.add_argument("--brokers", type=int, choices=[1, 3], default=1,
                       help="one combined broker+controller, or three on loopback (default 1)")
    kafka.add_argument("--data-dir", default=None,
                       help="where the nodes keep their data (default: a temporary directory)")
    kafka.add_argument("--version", default=KAFKA_VERSION,
                       help=f"Apache Kafka version on Maven Central (default {KAFKA_VERSION})")
    kafka.add_argument("--tls", action="store_true",
                       help="a TLS listener, with a certificate signed by a CA made for the "
                            "cluster (kept in its data directory); prints 'ca: PATH' for "
                            "clients' Endpoint=kafkas://...;CaFile=PATH")
    kafka.set_defaults(handler=cmd_kafka)

    certificates = commands.add_parser(
        "certificates", parents=[common],
        help="make a private CA and a TLS certificate for Kafka's listeners",
        description="Write ca.pem (the CA clients trust: CaFile=PATH) and server.pem (the "
                    "brokers' PKCS#8 key and certificate chain, for ssl.keystore.type=PEM) "
                    "into a directory; files already there are kept. The secured compose "
                    "profile runs this once.")
    certificates.add_argument("--out", required=True, help="the directory to write them to")
    certificates.add_argument("--host", action="append", required=True,
                              help="a host name or IP address the brokers are reached by "
                                   "(repeat for each)")
    certificates.set_defaults(handler=cmd_certificates)

    worker = commands.add_parser(
        "worker", parents=[common], help="run an engine worker (Faust) for a namespace",
        description="Run a settlement engine worker in the foreground until SIGTERM/SIGINT.")
    worker.add_argument("--data-dir", default="data/engine",
                        help="RocksDB directory, one per worker (default: data/engine)")
    worker.add_argument("--web-port", type=int, default=None,
                        help="Faust web server port (disabled by default)")
    worker.add_argument("--metrics-port", type=int, default=None,
                        help="serve Prometheus metrics at http://HOST:PORT/metrics "
                             "(not served by default)")
    worker.add_argument("--loglevel", default="info",
                        choices=["debug", "info", "warning", "error", "critical"],
                        help="worker log level (default: info)")
    worker.set_defaults(handler=cmd_worker)

    admin_cli.add_commands(commands, common)
    namespace_cli.add_commands(commands, common)
    _add_send(commands, common)
    _add_receive(commands, common)
    _add_peek(commands, common)

    _add_dlq_commands(commands, common)
    _add_acl(commands, common)
    spark_cli.add_commands(commands, common, connection_string)
    pair_cli.add_commands(commands, common, connection_string)
    return parser


def _add_acl(commands: Any, common: argparse.ArgumentParser) -> None:
    acl = commands.add_parser(
        "acl", parents=[common], help="print or apply the Kafka ACLs of a right",
        description="The Kafka ACLs that give a principal a Service Bus right (Send, Listen, "
                    "Manage) on the connection string's namespace or one of its entities, or "
                    "that an engine worker needs. Printed; applied with --apply (the "
                    "connection string's principal must be allowed to alter ACLs).")
    acl.add_argument("principal", help="the Kafka principal, e.g. User:orders-app")
    who = acl.add_mutually_exclusive_group(required=True)
    who.add_argument("--right", choices=["Send", "Listen", "Manage"])
    who.add_argument("--engine", action="store_true", help="the ACLs of an engine worker")
    acl.add_argument("--entity", default=None,
                     help="only this entity (default: every entity of the namespace)")
    acl.add_argument("--apply", action="store_true", help="create the ACLs on the cluster")
    acl.set_defaults(handler=cmd_acl)


def _add_dlq_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    sub = add_group(commands, common, "dlq", "list, resubmit or purge dead letters",
                    "Work with the dead-letter sub-queue of a queue or of a subscription "
                    "(TOPIC/subscriptions/SUB). 'settlement dlq ENTITY' is "
                    "'settlement dlq list ENTITY'.")
    listing = add_command(sub, common, "list", cmd_peek, "show dead letters (peek)",
                          "Show the dead letters of ENTITY without locking or settling "
                          "them: 'settlement peek ENTITY --dead-letter'.", "ENTITY")
    _add_peek_options(listing, default_max=100)
    listing.set_defaults(dead_letter=True)
    resubmit = add_command(
        sub, common, "resubmit", cmd_dlq_resubmit, "send dead letters back to their queue",
        "Send dead letters back to QUEUE (same body, id and properties; dead-letter fields "
        "cleared, delivery count reset), each once. Not for subscriptions: they have no "
        "log of their own to send to.", "QUEUE")
    resubmit.add_argument("--reason", default=None, help="only dead letters with this reason")
    resubmit.add_argument("--since", default=None, metavar="TIME",
                          help="only messages enqueued at or after TIME (ISO 8601, UTC)")
    resubmit.add_argument("--limit", type=int, default=None, metavar="N",
                          help="at most this many")
    purge = add_command(sub, common, "purge", cmd_dlq_purge, "delete every dead letter",
                        "Complete (remove) every dead letter of ENTITY, after asking "
                        "'Delete N dead letters of ENTITY? [y/N]' on the terminal. Without "
                        "a terminal (a script, a pipe) it deletes only with --yes.", "ENTITY")
    purge.add_argument("--yes", action="store_true", help="delete without asking")


def _add_common(parser: argparse.ArgumentParser, *, top_level: bool) -> None:
    """``-v`` and ``--connection-string``, accepted before or after the command."""
    # A sub-command's defaults would overwrite values given before the command,
    # so there they are SUPPRESSed and only set when given.
    default: Any = None if top_level else argparse.SUPPRESS
    parser.add_argument("-v", "--verbose", action="count",
                        default=0 if top_level else argparse.SUPPRESS,
                        help="log more (-v info, -vv debug)")
    parser.add_argument("--connection-string", default=default, metavar="CONN",
                        help="'Endpoint=kafka://HOST:PORT;Namespace=NAME' "
                             f"(default: ${ENV_CONNECTION_STRING})")


def _add_send(commands: Any, common: argparse.ArgumentParser) -> None:
    send = commands.add_parser(
        "send", parents=[common], help="send messages to a queue or a topic",
        description="Send each BODY (as UTF-8 text) to the queue or topic NAME, --count "
                    "times over; without BODY (or with '-'), each line of standard input "
                    "is a body. A topic stores each message once and delivers it to every "
                    "subscription whose rules select it.")
    send.add_argument("entity", metavar="NAME")
    send.add_argument("body", metavar="BODY", nargs="*",
                      help="message bodies (default: the lines of standard input)")
    send.add_argument("--message-id", default=None, metavar="ID",
                      help="message id; with more than one message, ID-0, ID-1, ...")
    send.add_argument("--ttl", type=float, default=None, metavar="SECONDS",
                      help="time_to_live of every message, in seconds (default: the "
                           "entity's default_message_time_to_live)")
    send.add_argument("--scheduled-at", type=_utc_time, default=None, metavar="TIME",
                      help="scheduled_enqueue_time_utc: the messages stay invisible until "
                           "TIME (ISO 8601, e.g. 2026-12-01T08:00:00+01:00; without an "
                           "offset, UTC)")
    send.add_argument("--property", action="append", default=[], metavar="KEY=VALUE",
                      help="application property (repeatable); VALUE is read as a JSON "
                           "number, true/false/null when it is one, else as text")
    send.add_argument("--subject", default=None, help="the subject (label) of every message")
    send.add_argument("--correlation-id", default=None, metavar="ID",
                      help="the correlation id of every message")
    send.add_argument("--session-id", default=None, metavar="ID",
                      help="the session of every message (session-enabled entities)")
    send.add_argument("--count", type=int, default=1, metavar="N",
                      help="send the bodies N times (progress bar above 100 messages)")
    send.set_defaults(handler=cmd_send)


def _add_receive(commands: Any, common: argparse.ArgumentParser) -> None:
    receive = commands.add_parser(
        "receive", parents=[common], help="receive and settle messages",
        description="Receive up to --max messages from a queue or a subscription "
                    "(TOPIC/subscriptions/SUB), settle them all as --settle says, and "
                    "print one line per message: sequence number, delivery count, message "
                    "id, body, application properties and the settlement done.")
    receive.add_argument("entity", metavar="ENTITY")
    receive.add_argument("--max", type=int, default=1, metavar="N",
                         help="at most this many messages (default: 1)")
    receive.add_argument("--wait", type=float, default=5.0, metavar="SECONDS",
                         help="seconds to wait for the first message (default: 5)")
    receive.add_argument("--mode", choices=["peek-lock", "receive-and-delete"],
                         default="peek-lock", help="receive mode (default: peek-lock)")
    receive.add_argument("--settle", choices=[*SETTLE_ACTIONS, "none"], default=None,
                         help="settlement for every message received (default: complete in "
                              "peek-lock mode; none, i.e. deleted on receipt, in "
                              "receive-and-delete mode)")
    receive.add_argument("--reason", default=None, help="dead-letter reason")
    receive.add_argument("--description", default=None, help="dead-letter error description")
    receive.add_argument("--dead-letter", action="store_true",
                         help="receive from the dead-letter sub-queue of ENTITY")
    receive.add_argument("--session", default=None, metavar="ID",
                         help="on a session-enabled entity: the session to receive from, or "
                              "'next' for the next available one")
    add_output_option(receive)
    receive.set_defaults(handler=cmd_receive)


def _add_peek(commands: Any, common: argparse.ArgumentParser) -> None:
    peek = commands.add_parser(
        "peek", parents=[common], help="show messages without locking them",
        description="Show the messages of a queue or a subscription (TOPIC/subscriptions/"
                    "SUB), active, deferred and scheduled, each with its state, without "
                    "locking, settling or counting a delivery; with --dead-letter, its dead "
                    "letters.")
    peek.add_argument("entity", metavar="ENTITY")
    _add_peek_options(peek, default_max=10)
    add_output_option(peek)
    peek.add_argument("--dead-letter", action="store_true",
                      help="the dead-letter sub-queue of ENTITY (as 'settlement dlq list')")
    peek.set_defaults(handler=cmd_peek)


def _add_peek_options(parser: argparse.ArgumentParser, *, default_max: int) -> None:
    parser.add_argument("--max", type=int, default=default_max, metavar="N",
                        help=f"at most this many (default: {default_max})")
    parser.add_argument("--from-sequence", type=int, default=0, metavar="N",
                        help="start at sequence number N (default: the first)")


# ----------------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return the process exit code."""
    parser = build_parser()
    argv = _dlq_list_by_default(list(sys.argv[1:] if argv is None else argv))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed)
        return exc.code if isinstance(exc.code, int) else 2
    _configure_logging(args.verbose)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        getattr(args, "parser", parser).print_help(sys.stderr)
        return 2
    try:
        return handler(args)
    except (ServiceBusError, ValueError, ConnectionStringError) as exc:
        log.debug("command failed", exc_info=True)
        print(f"error: {_message(exc)}", file=sys.stderr)
        return 2
    except (KafkaException, ProvisioningError, TimeoutError) as exc:
        # Raw Kafka failures the library lets through (broker down, namespace
        # not provisioned): still one line, not a traceback.
        log.debug("command failed", exc_info=True)
        print(f"error: Kafka request failed: {_message(exc)} (is the broker up and the "
              "namespace provisioned by 'settlement worker'?)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _dlq_list_by_default(argv: list[str]) -> list[str]:
    """``settlement dlq QUEUE`` lists, as before ``dlq`` had sub-commands."""
    positional = [i for i, a in enumerate(argv) if not a.startswith("-")
                  and (i == 0 or argv[i - 1] != "--connection-string")]
    if positional and argv[positional[0]] == "dlq":
        at = positional[0] + 1
        rest = [a for a in argv[at:] if not a.startswith("-")]
        if rest and rest[0] not in ("list", "resubmit", "purge"):
            argv.insert(at, "list")
    return argv


def _configure_logging(verbose: int) -> None:
    level = logging.WARNING if not verbose else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(level)


def _message(exc: BaseException) -> str:
    if isinstance(exc, ServiceBusError):
        return exc.message
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0].str()
    return str(exc)


def _client(args: argparse.Namespace) -> ServiceBusClient:
    return ServiceBusClient.from_connection_string(connection_string(args))


def _definition(args: argparse.Namespace, name: str) -> Definition | None:
    """What ``name`` is in the namespace (queue, topic or subscription path),
    or None: one read of the entities topic."""
    registry = EntityRegistry(parse_connection_string(connection_string(args)))
    try:
        return registry.load_all().get(name)
    finally:
        registry.close()


@contextmanager
def _not_a_topic(args: argparse.Namespace, entity: str) -> Iterator[None]:
    """Turn "queue X does not exist" into what to do when X is a topic: a
    topic is not received from, its subscriptions are. Looked up only when
    the entity was not found, so a receive pays nothing for it."""
    try:
        yield
    except MessagingEntityNotFoundError:
        if isinstance(_definition(args, entity), TopicProperties):
            raise UsageError(
                f"{entity!r} is a topic, whose messages are received from its "
                f"subscriptions: name one as '{entity}{names.SUBSCRIPTIONS}SUB' (list them "
                f"with 'settlement subscription list {entity}')") from None
        raise


# ------------------------------------------------------------------------- commands
def cmd_broker(args: argparse.Namespace) -> int:
    if args.tansu:
        if args.data_dir is not None:
            raise UsageError("--data-dir is for Apache Kafka: Tansu (--tansu) keeps "
                             "everything in memory")
        return run_tansu("127.0.0.1", args.port)
    return run_kafka(args.port, 1, args.data_dir or BROKER_DATA_DIR, KAFKA_VERSION)


def cmd_certificates(args: argparse.Namespace) -> int:
    files = make_certificates(Path(args.out), args.host)
    print(f"ca: {files.ca}")
    print(f"server: {files.server}")
    return 0


def cmd_kafka(args: argparse.Namespace) -> int:
    return run_kafka(args.port, args.brokers, args.data_dir, args.version, tls=args.tls)


def cmd_worker(args: argparse.Namespace) -> int:
    conn = connection_string(args)
    settings = parse_connection_string(conn)
    settings.ssl_context()  # a CaFile that cannot be read is named now
    # Refused credentials and TLS on one side only are said now, not logged
    # by Faust once per reconnection.
    check_connection(settings)
    run_worker(conn, args.data_dir, args.web_port, args.loglevel, args.metrics_port)
    return 0


def cmd_acl(args: argparse.Namespace) -> int:
    settings = parse_connection_string(connection_string(args))
    bindings = (rights.engine_acl_bindings(settings.namespace, args.principal) if args.engine
                else rights.acl_bindings(settings.namespace, args.principal, args.right,
                                         args.entity))
    for binding in bindings:
        print(rights.describe(binding))
    if args.apply:
        admin = AdminClient(settings.kafka_config())
        for future in admin.create_acls(bindings).values():
            future.result(30)
        print(f"applied {len(bindings)} ACLs")
    return 0


def cmd_send(args: argparse.Namespace) -> int:
    if args.count < 1:
        raise UsageError(f"--count must be at least 1, got {args.count}")
    if args.ttl is not None and args.ttl <= 0:
        raise UsageError(f"--ttl must be more than 0 seconds, got {args.ttl:g}")
    properties = _parse_properties(args.property)
    bodies = _bodies(args.body)
    total = len(bodies) * args.count
    messages = (_message_to_send(body, i, total, args, properties)
                for i, body in enumerate(bodies * args.count))
    kind = _sendable_kind(args, args.entity)
    with _client(args) as client, _sender(client, kind, args.entity) as sender, \
            tqdm(total=total, unit="msg", disable=total <= 100, file=sys.stderr) as bar:
        chunk: list[ServiceBusMessage] = []
        for message in messages:
            chunk.append(message)
            if len(chunk) == SEND_CHUNK:
                sender.send_messages(chunk)
                bar.update(len(chunk))
                chunk = []
        if chunk:
            sender.send_messages(chunk)
            bar.update(len(chunk))
    print(f"sent {total} message(s) to {kind} {args.entity!r}")
    return 0


def _bodies(given: list[str]) -> list[str]:
    """The BODY arguments, or with none (or '-') the lines of standard input,
    each without its line ending (an empty line is an empty body)."""
    if given not in ([], ["-"]):
        if "-" in given:
            raise UsageError("'-' (read bodies from standard input) cannot be mixed with "
                             "BODY arguments: give either")
        return given
    if sys.stdin.isatty():
        print("reading message bodies from standard input, one per line (end with Ctrl-D)",
              file=sys.stderr)
    return [line.removesuffix("\n") for line in sys.stdin]


def _utc_time(text: str) -> dt.datetime:
    """An ISO 8601 time as an aware datetime; one without an offset is UTC."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time such as 2026-12-01T08:00:00Z, got {text!r}") from None
    return when.replace(tzinfo=dt.UTC) if when.tzinfo is None else when.astimezone(dt.UTC)


def _sendable_kind(args: argparse.Namespace, name: str) -> str:
    """``"queue"`` or ``"topic"``: what ``name`` is, looked up so that
    ``settlement send NAME`` works for both; anything else is refused with
    what to send to instead."""
    found = _definition(args, name)
    if isinstance(found, TopicProperties):
        return "topic"
    if isinstance(found, QueueProperties):
        return "queue"
    if isinstance(found, SubscriptionProperties) or names.SUBSCRIPTIONS in name:
        topic = name.partition(names.SUBSCRIPTIONS)[0]
        raise UsageError(f"{name!r} names a subscription, which is not sent to: send to its "
                         f"topic {topic!r}, and every subscription whose rules select a "
                         "message gets a copy")
    namespace = parse_connection_string(connection_string(args)).namespace
    raise MessagingEntityNotFoundError(
        f"no queue or topic named {name!r} in namespace {namespace!r}: create one with "
        f"'settlement queue create {name}' or 'settlement topic create {name}'")


def _sender(client: ServiceBusClient, kind: str, name: str) -> ServiceBusSender:
    return client.get_topic_sender(name) if kind == "topic" else client.get_queue_sender(name)


def cmd_receive(args: argparse.Namespace) -> int:
    mode = (ServiceBusReceiveMode.PEEK_LOCK if args.mode == "peek-lock"
            else ServiceBusReceiveMode.RECEIVE_AND_DELETE)
    settle = _settle_choice(args, mode)
    sub_queue = ServiceBusSubQueue.DEAD_LETTER if args.dead_letter else None
    session = NEXT_AVAILABLE_SESSION if args.session == "next" else args.session
    with _client(args) as client, _not_a_topic(args, args.entity), client.get_queue_receiver(
            args.entity, sub_queue=sub_queue, receive_mode=mode, session_id=session,
            max_wait_time=args.wait) as receiver:
        messages = receive_up_to(receiver, args.max, args.wait)
        outcomes = _settle_all(receiver, messages, settle, args.reason, args.description)
    print_messages(messages, args.output, outcomes)
    print(f"received {len(messages)} message(s) from {receiver.entity_path!r}", file=sys.stderr)
    return 1 if any(o.startswith("failed") for o in outcomes) else 0


def cmd_peek(args: argparse.Namespace) -> int:
    """``peek`` and ``dlq list``: the SDK's ``peek_messages``, which locks nothing."""
    if args.max < 1:
        raise UsageError(f"--max must be at least 1, got {args.max}")
    if args.from_sequence < 0:
        raise UsageError(f"--from-sequence must not be negative, got {args.from_sequence}")
    sub_queue = ServiceBusSubQueue.DEAD_LETTER if args.dead_letter else None
    with _client(args) as client, _not_a_topic(args, args.entity), client.get_queue_receiver(
            args.entity, sub_queue=sub_queue) as receiver:
        messages = receiver.peek_messages(args.max, sequence_number=args.from_sequence)
    print_messages(messages, args.output)
    what = "dead-lettered message(s)" if args.dead_letter else "message(s)"
    print(f"{len(messages)} {what} in {args.entity!r} (left in place)", file=sys.stderr)
    return 0


def cmd_dlq_resubmit(args: argparse.Namespace) -> int:
    since = dt.datetime.fromisoformat(args.since) if args.since else None
    with _client(args) as client, _not_a_topic(args, args.queue), \
            tqdm(unit="msg", desc="resubmitted", disable=None) as bar:
        count = resubmit_dead_letters(client, args.queue, reason=args.reason, since=since,
                                      limit=args.limit, on_progress=bar.update)
    print(f"resubmitted {count} dead letter(s) to {args.queue!r}")
    return 0


def cmd_dlq_purge(args: argparse.Namespace) -> int:
    if not args.yes:
        with _not_a_topic(args, args.entity):
            count = _dead_letter_count(args, args.entity)
        if count and not sys.stdin.isatty():
            raise UsageError(f"not deleting {count} dead letter(s) of {args.entity!r} unasked, "
                             "and standard input is not a terminal to ask on: pass --yes")
        if count and not _yes(f"Delete {count} dead letters of {args.entity!r}?"):
            print("nothing deleted", file=sys.stderr)
            return 1
    with _client(args) as client, _not_a_topic(args, args.entity), \
            tqdm(unit="msg", desc="purged", disable=None) as bar:
        count = purge_dead_letters(client, args.entity, on_progress=bar.update)
    print(f"purged {count} dead letter(s) of {args.entity!r}")
    return 0


def _dead_letter_count(args: argparse.Namespace, entity: str) -> int:
    with admin_client(args) as admin:
        if names.SUBSCRIPTIONS in entity:
            topic, subscription = names.split_subscription_path(entity)
            return admin.get_subscription_runtime_properties(
                topic, subscription).dead_letter_message_count
        return admin.get_queue_runtime_properties(entity).dead_letter_message_count


def _yes(question: str) -> bool:
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


# -------------------------------------------------------------------------- helpers
def receive_up_to(receiver: ServiceBusReceiver, max_count: int, wait: float
                  ) -> list[ServiceBusReceivedMessage]:
    """Up to ``max_count`` messages: wait ``wait`` s for the first ones, then take
    what else arrives within :data:`DRAIN_WAIT_S`. Nothing is settled here, so
    in peek-lock mode a message is received once (a lapsed lock that comes back
    replaces the earlier copy)."""
    if max_count < 1:
        raise UsageError(f"--max must be at least 1, got {max_count}")
    if wait < 0:
        raise UsageError(f"--wait must not be negative, got {wait}")
    got: dict[int, ServiceBusReceivedMessage] = {}
    timeout = wait
    while len(got) < max_count:
        batch = receiver.receive_messages(max_count - len(got), max_wait_time=timeout)
        if not batch:
            break
        got.update((m.sequence_number, m) for m in batch)
        timeout = min(wait, DRAIN_WAIT_S)
    return list(got.values())


def _settle_choice(args: argparse.Namespace, mode: ServiceBusReceiveMode) -> str:
    settle = args.settle
    if mode == ServiceBusReceiveMode.RECEIVE_AND_DELETE:
        if settle not in (None, "none"):
            raise UsageError("messages received in receive-and-delete mode are deleted on "
                             f"receipt: drop --settle {settle} or use --mode peek-lock")
        return "none"
    settle = settle or "complete"
    if (args.reason or args.description) and settle != "dead-letter":
        raise UsageError("--reason and --description go with --settle dead-letter")
    if args.dead_letter and settle in ("dead-letter", "defer"):
        raise UsageError(f"messages in the dead-letter sub-queue cannot be "
                         f"{SETTLE_ACTIONS[settle][1]} again: use --settle complete, abandon "
                         "or none")
    return settle


def _settle_all(receiver: ServiceBusReceiver, messages: list[ServiceBusReceivedMessage],
                settle: str, reason: str | None, description: str | None) -> list[str]:
    """Settle every message in one command per partition; an outcome per message."""
    if settle == "none" or not messages:
        deleted = receiver.receive_mode == ServiceBusReceiveMode.RECEIVE_AND_DELETE
        return ["deleted-on-receipt" if deleted else "none (lock lapses)"] * len(messages)
    action, done = SETTLE_ACTIONS[settle]
    results = receiver.settle_messages(messages, action, reason, description)
    return [done if r.error is None else f"failed ({_message(r.error)})" for r in results]


def _parse_properties(pairs: list[str]) -> dict[str, PropertyValue]:
    return {key: property_value(raw)
            for key, raw in (split_pair(pair, "--property") for pair in pairs)}


def _message_to_send(body: str, index: int, total: int, args: argparse.Namespace,
                     properties: dict[str, PropertyValue]) -> ServiceBusMessage:
    message_id = args.message_id
    if message_id is not None and total > 1:
        message_id = f"{message_id}-{index}"
    time_to_live = None if args.ttl is None else dt.timedelta(seconds=args.ttl)
    return ServiceBusMessage(body, message_id=message_id, subject=args.subject,
                             correlation_id=args.correlation_id, session_id=args.session_id,
                             application_properties=dict(properties),
                             time_to_live=time_to_live,
                             scheduled_enqueue_time_utc=args.scheduled_at)
