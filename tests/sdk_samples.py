"""The azure-servicebus SDK's own samples, run against settlement.

The samples come from the SDK's source package on PyPI at a pinned version
(its sha256 checked), cached under ``~/.cache/settlement/sdk-samples``. Each
is ported by changing only its import lines (``azure.servicebus`` ->
``settlement``, ``azure.servicebus.aio`` -> ``settlement.aio``, ...;
``azure.core`` and ``azure.identity`` stay) and run as a subprocess with the
environment it reads (``SERVICEBUS_CONNECTION_STR``, ``SERVICEBUS_QUEUE_NAME``,
...) pointing at entities created for it alone, with the properties the
samples assume (a session queue needs sessions, a topic has a subscription).

What cannot run here, and why, is :data:`CANNOT_RUN`; the README's section
"The SDK's samples" says the same. ``python -m tests.sdk_samples SAMPLE.py
FACTOR`` is how a sample is started (see :func:`main`)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import runpy
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import Any

#: The last release whose samples use connection strings (7.15.0's make the same calls).
SDK_VERSION = "7.11.4"
#: sha256 of ``azure-servicebus-7.11.4.tar.gz`` as PyPI serves it.
SDK_SHA256 = "f7bd297791b6a577ce36a39ea0abb10aa0f875b6bb0d31522ed9ed2bb0288d4c"
CACHE_DIR = (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
             / "settlement" / "sdk-samples")
REPO = Path(__file__).resolve().parent.parent
#: How long one sample may run.
TIMEOUT_S = 60.0


#: The samples that cannot run here, by name without ``_async`` (both
#: flavours), and why. The test expects each to fail (strictly: one that passes
#: must leave this list), as the README's section "The SDK's samples" says.
CANNOT_RUN: dict[str, str] = {
    "client_identity_authentication": (
        "needs Azure AD: it signs in with azure.identity's EnvironmentCredential, a token "
        "Kafka cannot check"),
    "sample_code_servicebus": (
        "needs Azure AD: every client it builds first signs in with azure.identity's "
        "DefaultAzureCredential"),
    "proxy": (
        "needs an HTTP proxy at 127.0.0.1:8899 (on Azure too), and Kafka clients connect to "
        "the brokers directly: http_proxy is refused with a TypeError"),
    "connection_to_custom_endpoint_address": (
        "its custom_endpoint_address and connection_verify are placeholders "
        "('sb://<custom_endpoint_hostname>:<custom_endpoint_port>', a CA bundle path) that "
        "fail on Azure too; here the connection string's Endpoint names the brokers and "
        "custom_endpoint_address is refused with a TypeError"),
}

#: Samples that only receive: the harness sends them these messages first.
SEEDED = frozenset({"receive_queue", "receive_peek", "receive_iterator_queue",
                    "receive_subscription"})
SEED_BODIES = tuple(f"seeded message {i}" for i in range(3))

#: What a sample must print to pass, beyond ending without an error: proof
#: that it did its work, not only that it ran.
MUST_PRINT: dict[str, str] = {
    "receive_queue": SEED_BODIES[-1],
    "receive_peek": SEED_BODIES[1],
    "receive_iterator_queue": SEED_BODIES[-1],
    "receive_subscription": SEED_BODIES[-1],
    "receive_deferred_message_queue": "Completing deferred msg",
    "deadletter_messages_and_correct": "Received fixed message",
    "failure_and_recovery": "Data 9",
    # the VALUE body it sent, received with its bytes and types
    "send_and_receive_amqp_annotated_message": "{b'key': [-123, b'data', False]}",
}

#: Samples that receive with ``for msg in receiver`` and no ``max_wait_time``,
#: which waits for messages forever, in the SDK as here: they pass once they
#: printed their MUST_PRINT text and are still running without an error.
RUNS_UNTIL_STOPPED = frozenset({"receive_iterator_queue", "failure_and_recovery"})

#: Samples whose own sleeps (``time.sleep``/``asyncio.sleep`` called from the
#: sample's file) are divided by this factor, with the lock duration of their
#: entities divided alike (from Azure's default of 60 s), so each sleep still
#: outlasts a lock: ``auto_lock_renew`` sleeps 100 + 100 + 80 s otherwise.
SHORTENED_SLEEPS: dict[str, int] = {"auto_lock_renew": 10}


@dataclass(frozen=True)
class Sample:
    """One sample file of the SDK: ``sync`` or ``async``."""

    flavour: str
    path: Path

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def base(self) -> str:
        """The name shared by the sync and async twins."""
        return self.name.removesuffix("_async")

    @property
    def id(self) -> str:
        return f"{self.flavour}/{self.name}"

    @cached_property
    def reads(self) -> frozenset[str]:
        """The ``SERVICEBUS_*`` environment variables the sample reads."""
        return frozenset(re.findall(r"SERVICEBUS_[A-Z_]+", self.path.read_text()))

    @property
    def needs_sasl(self) -> bool:
        return "SERVICEBUS_SAS_KEY" in self.reads

    def unfit(self) -> str | None:
        """Why the sample cannot run here, or None."""
        return CANNOT_RUN.get(self.base)


def _download_sdist() -> Path:
    """The SDK's source package, from the cache or PyPI, its sha256 checked."""
    sdist = CACHE_DIR / f"azure-servicebus-{SDK_VERSION}.tar.gz"
    if not sdist.exists():
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE_DIR) as tmp:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:",
                 "--no-deps", f"azure-servicebus=={SDK_VERSION}", "-d", tmp],
                capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                raise RuntimeError(
                    f"could not download azure-servicebus {SDK_VERSION}'s source package from "
                    f"PyPI (pip download said: {done.stderr.strip()[-500:]}); check the network "
                    f"or put the file at {sdist}")
            os.replace(Path(tmp) / sdist.name, sdist)
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDK_SHA256:
        sdist.unlink()
        raise RuntimeError(f"{sdist.name} has sha256 {digest}, not the pinned {SDK_SHA256}: "
                           "it was removed; the next run downloads it again")
    return sdist


def samples_dir() -> Path:
    """``samples/`` of the SDK's source package, unpacked once into the cache."""
    root = CACHE_DIR / f"azure-servicebus-{SDK_VERSION}"
    if not (root / "samples").is_dir():
        sdist = _download_sdist()
        with tempfile.TemporaryDirectory(dir=CACHE_DIR) as tmp, tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if "/samples/" in m.name]
            tar.extractall(tmp, members=members, filter="data")
            shutil.rmtree(root, ignore_errors=True)
            os.replace(Path(tmp) / root.name, root)
    return root / "samples"


def samples() -> list[Sample]:
    """Every sync and async sample of the pinned SDK, sync first."""
    found = samples_dir()
    return [Sample(flavour, path) for flavour in ("sync", "async")
            for path in sorted((found / f"{flavour}_samples").glob("*.py"))]


_SDK_IMPORT = re.compile(r"^(\s*(?:from|import)\s+)azure\.servicebus\b")


def port(source: str) -> str:
    """The sample with ``azure.servicebus`` imports taken from ``settlement``;
    no other line changes."""
    return "".join(_SDK_IMPORT.sub(r"\1settlement", line)
                   for line in source.splitlines(keepends=True))


@dataclass
class Namespace:
    """Where samples run: a connection string, an administration client on
    it and the SAS policy (user) and key the credential samples sign in with."""

    conn: str
    admin: Any
    sas_policy: str = "RootManageSharedAccessKey"
    sas_key: str = "no-key-on-this-broker"

    def __post_init__(self) -> None:
        self._lock = threading.Lock()  # one admin call at a time, from the runner's threads

    @property
    def fully_qualified_namespace(self) -> str:
        """``HOST:PORT/NAMESPACE``: what ``ServiceBusClient(fully_qualified_namespace, ...)``
        takes here."""
        from topics.connection import parse_connection_string

        settings = parse_connection_string(self.conn)
        return f"{settings.bootstrap_servers}/{settings.namespace}"

    def prepare(self, sample: Sample) -> dict[str, str]:
        """Create the entities ``sample`` reads from its environment (fresh,
        for it alone), send its seed messages, and return that environment."""
        unique = uuid.uuid4().hex[:6]
        stem = sample.name.replace("_", "-")[:40]
        lock = timedelta(seconds=60 / SHORTENED_SLEEPS.get(sample.base, 1))
        env = {"SERVICEBUS_CONNECTION_STR": self.conn,
               "SERVICEBUS_FULLY_QUALIFIED_NAMESPACE": self.fully_qualified_namespace,
               "SERVICEBUS_SAS_POLICY": self.sas_policy, "SERVICEBUS_SAS_KEY": self.sas_key,
               "SERVICEBUS_SESSION_ID": f"session-{unique}"}
        with self._lock:
            if "SERVICEBUS_QUEUE_NAME" in sample.reads:
                env["SERVICEBUS_QUEUE_NAME"] = f"{stem}-{unique}"
                self.admin.create_queue(env["SERVICEBUS_QUEUE_NAME"], lock_duration=lock)
            if "SERVICEBUS_SESSION_QUEUE_NAME" in sample.reads:
                env["SERVICEBUS_SESSION_QUEUE_NAME"] = f"{stem}-sessions-{unique}"
                self.admin.create_queue(env["SERVICEBUS_SESSION_QUEUE_NAME"],
                                        lock_duration=lock, requires_session=True)
            if "SERVICEBUS_TOPIC_NAME" in sample.reads:
                env["SERVICEBUS_TOPIC_NAME"] = f"{stem}-topic-{unique}"
                env["SERVICEBUS_SUBSCRIPTION_NAME"] = f"{stem}-sub-{unique}"
                self.admin.create_topic(env["SERVICEBUS_TOPIC_NAME"])
                self.admin.create_subscription(env["SERVICEBUS_TOPIC_NAME"],
                                               env["SERVICEBUS_SUBSCRIPTION_NAME"],
                                               lock_duration=lock)
        if sample.base in SEEDED:
            self._seed(env.get("SERVICEBUS_QUEUE_NAME"), env.get("SERVICEBUS_TOPIC_NAME"))
        return env

    def _seed(self, queue: str | None, topic: str | None) -> None:
        from settlement import ServiceBusClient, ServiceBusMessage

        with ServiceBusClient.from_connection_string(self.conn) as client:
            sender = client.get_queue_sender(queue) if queue else client.get_topic_sender(topic)
            with sender:
                sender.send_messages([ServiceBusMessage(body) for body in SEED_BODIES])


@dataclass
class Outcome:
    """How one run of a sample went."""

    sample: Sample
    passed: bool
    why: str
    output: str = field(repr=False)
    seconds: float = field(repr=False)

    def first_error(self) -> str:
        """The exception line of the last traceback printed, else why it failed."""
        lines = self.output.splitlines()
        starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (")]
        if starts:
            for line in lines[starts[-1] + 1:]:
                if line and not line.startswith(" "):
                    return line
        return self.why

    def report(self, tail: int = 40) -> str:
        last = "\n".join(self.output.splitlines()[-tail:])
        return (f"{self.sample.id}: {self.first_error()} ({self.why}, {self.seconds:.0f} s); "
                f"the last {tail} lines of its output:\n{last}")


def run(sample: Sample, env: dict[str, str], workdir: Path,
        timeout: float = TIMEOUT_S) -> Outcome:
    """Port ``sample`` into ``workdir``, run it with ``env`` and judge it."""
    ported = workdir / sample.flavour / sample.path.name
    ported.parent.mkdir(parents=True, exist_ok=True)
    ported.write_text(port(sample.path.read_text()))
    log = ported.with_suffix(".log")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SERVICEBUS_")}
    must_print = MUST_PRINT.get(sample.base, "")
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.sdk_samples", str(ported),
             str(SHORTENED_SLEEPS.get(sample.base, 1))],
            cwd=REPO, env={**clean, **env, "PYTHONUNBUFFERED": "1"},
            stdout=out, stderr=subprocess.STDOUT)
        try:
            why = _watch(proc, log, sample.base in RUNS_UNTIL_STOPPED, must_print, timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    output = log.read_text(errors="replace")
    if why is None and must_print not in output:
        why = f"it ended without printing {must_print!r}"
    return Outcome(sample, why is None, why or "passed", output, time.monotonic() - started)


def _watch(proc: subprocess.Popen[bytes], log: Path, runs_until_stopped: bool,
           must_print: str, timeout: float) -> str | None:
    """None if the run passed, else why not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None if proc.returncode == 0 else f"it exited with code {proc.returncode}"
        if runs_until_stopped and must_print in log.read_text(errors="replace"):
            time.sleep(1.0)  # a moment to fail in, after its work is done
            if proc.poll() is None and "Traceback (" not in log.read_text(errors="replace"):
                return None
        time.sleep(0.2)
    return f"still running after {timeout:.0f} s (killed)"


def _shorten_sleeps(sample_file: str, factor: float) -> None:
    """Divide the sleeps that ``sample_file``'s own code calls by ``factor``."""
    real_sleep, real_async_sleep = time.sleep, asyncio.sleep

    def scaled(seconds: float, caller: Any) -> float:
        return seconds / factor if caller.f_code.co_filename == sample_file else seconds

    def sleep(seconds: float) -> None:
        real_sleep(scaled(seconds, sys._getframe(1)))

    def async_sleep(delay: float, result: Any = None) -> Any:  # the caller is known when called
        return real_async_sleep(scaled(delay, sys._getframe(1)), result)

    time.sleep = sleep
    asyncio.sleep = async_sleep


def main(argv: list[str]) -> None:
    """Run the ported sample ``argv[1]`` as ``__main__``, its sleeps divided by ``argv[2]``."""
    sample_file, factor = argv[1], float(argv[2])
    if factor != 1:
        _shorten_sleeps(sample_file, factor)
    sys.argv = [sample_file]
    runpy.run_path(sample_file, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv)
