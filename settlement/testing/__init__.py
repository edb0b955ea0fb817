"""Brokers to run the client against, for tests, the bench, the demo and
local runs: :mod:`~settlement.testing.embedded` (Tansu, memory only, no JVM),
:mod:`~settlement.testing.apache_kafka` (Apache Kafka from Maven Central, one
node or three) and :mod:`~settlement.testing.maven`, which fetches the jars
described under ``jars/`` (Kafka's broker, the SAS handler). The client
library imports none of them."""
