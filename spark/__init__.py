"""Spark Structured Streaming over the engine's topics.

``spark.source.read_kafka_stream`` reads Kafka topics as a stream: with
Spark's own ``kafka`` connector where its jar is on the classpath, else with
the Python Data Source in ``spark.kafka_source``. ``spark.session`` builds the
local SparkSession (Java 17 required). Monitoring, the dashboard and replay
jobs build on these (issue 4).
"""
