"""Spark over the engine's topics: monitoring, the dashboard, replay and audit.

* ``source`` / ``kafka_source``: Kafka topics as a stream or a batch (Spark's
  ``kafka`` connector where its jar is on the classpath, else a Python Data
  Source over confluent-kafka), with the same columns either way;
* ``records``: the engine's event and state records as columns;
* ``monitor`` + ``metrics_store``: the streaming metrics job and its Parquet sink;
* ``dashboard`` + ``charts``: the page over that sink (no Spark needed);
* ``audit`` and ``replay``: batch jobs over the raw logs and the events;
* ``session``: the local SparkSession (Java 17 required); ``cli``: the commands.
"""
