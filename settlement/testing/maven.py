"""Jars from Maven Central, fetched once and cached outside the work tree.

Apache Kafka's broker and Spark's Kafka connector are JVM code published to
Maven Central. Each set is described by a ``pom.xml`` under
``settlement/testing/jars/<name>/`` and copied with Maven's own
``dependency:copy-dependencies`` into ``<cache>/<name>-<version>/``, so
Maven resolves the transitive dependencies and its ``~/.m2`` cache is reused.
A finished copy is renamed into place, so a crash or a parallel run never
leaves a half-filled directory that looks complete; processes fetching at
once take turns (:func:`cache_lock`), as Maven's own cache is not safe for two
filling it together.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

log = logging.getLogger(__name__)
POMS = Path(__file__).resolve().parent / "jars"


class JarFetchError(RuntimeError):
    """Java or Maven is missing, or Maven could not fetch the jars; says what to do."""


def cache_dir() -> Path:
    """``$SETTLEMENT_CACHE_DIR``, else ``$XDG_CACHE_HOME/kafka-settlement`` (``~/.cache``)."""
    explicit = os.environ.get("SETTLEMENT_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kafka-settlement"


def require_java() -> str:
    """The ``java`` executable, or a :class:`JarFetchError` saying what to install."""
    java = shutil.which("java")
    if java is None:
        raise JarFetchError("Java 17 is required to run Apache Kafka and Spark: "
                            "install it (Debian: 'apt-get install openjdk-17-jre-headless')")
    return java


#: what Maven runs to fill the output directory: copy a POM's dependencies
COPY_DEPENDENCIES = ("dependency:copy-dependencies", "-DincludeScope=runtime")


def fetch_jars(name: str, properties: dict[str, str],
               goals: tuple[str, ...] = COPY_DEPENDENCIES) -> Path:
    """The directory of jars for ``settlement/testing/jars/<name>/pom.xml`` with
    ``properties`` (e.g. ``{"kafka.version": "4.4.0"}``), fetched on first use.
    Other ``goals`` build the POM's own jar there (its ``outputDirectory``)."""
    version = "-".join(properties.values())
    target = cache_dir() / f"{name}-{version}"
    if (target / ".complete").exists():
        return target
    with cache_lock(target.parent):
        if (target / ".complete").exists():  # fetched by another process meanwhile
            return target
        return _fetch(name, version, properties, goals, target)


@contextlib.contextmanager
def cache_lock(directory: Path) -> Iterator[None]:
    """Hold ``DIRECTORY/.lock`` until the block ends: one process at a time
    fills that cache (Maven's, or Spark's Ivy: ``make test`` runs two pytest
    workers, each starting Kafka and Spark). The lock lives in the directory
    being filled, so whoever may fill it may lock it. An flock: it ends with
    its process, so a crash leaves no stale lock."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield  # closing the file releases it


def _fetch(name: str, version: str, properties: dict[str, str], goals: tuple[str, ...],
           target: Path) -> Path:
    require_java()
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarFetchError(f"Maven is required to fetch {name} {version} from Maven Central: "
                            "install it (Debian: 'apt-get install maven'; 'make' does this)")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    defines = [f"-D{key}={value}" for key, value in properties.items()]
    command = [mvn, "-q", "-B", "-f", str(POMS / name / "pom.xml"), *defines,
               *goals, f"-DoutputDirectory={staging}"]
    log.info("fetching %s %s from Maven Central into %s (once; about a minute)",
             name, version, target)
    started = time.monotonic()
    returncode, output = _run_with_progress(command, f"fetching {name} {version}")
    if returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        tail = "\n".join(output.strip().splitlines()[-15:])
        raise JarFetchError(
            f"Maven could not fetch {name} {version} from Maven Central (exit "
            f"{returncode}); check the network or the proxy in ~/.m2/settings.xml, and "
            f"that version {version} exists. Maven said:\n{tail}")
    log.info("fetched %s %s in %.0f s", name, version, time.monotonic() - started)
    (staging / ".complete").touch()
    try:
        staging.rename(target)
    except OSError:  # a parallel run finished first; its copy is as good as ours
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _run_with_progress(command: list[str], what: str) -> tuple[int, str]:
    """Run Maven (quiet, so it prints nothing while it works) under a progress
    line with the time spent so far; its exit code and output."""
    with tempfile.TemporaryFile() as output, \
            tqdm(desc=what, bar_format="{desc}: {elapsed}", mininterval=1.0) as progress:
        proc = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        while proc.poll() is None:
            time.sleep(1.0)
            progress.update()
        output.seek(0)
        return proc.returncode, output.read().decode("utf-8", "replace")
