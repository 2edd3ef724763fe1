"""An independent consumer of the Kafka suite (confluent-kafka, librdkafka's Python
client), so that what the sink published is read back by a client other than its own.

    read_back.py BROKERS create TOPIC PARTITIONS   create the topic
    read_back.py BROKERS read TOPIC EXPECT         the records of the topic (see `read`),
                                                   one JSON line each: partition, offset,
                                                   key, headers (name -> text), value length
"""
import json
import sys
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def create(brokers, topic, partitions):
    admin = AdminClient({"bootstrap.servers": brokers})
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1)]
    )
    for future in futures.values():
        future.result(timeout=30)


def read(brokers, topic, expect):
    """Reads from each partition's first offset until `expect` records came and then
    none for 2 s more (a duplicate after them is read too), or none for 15 s. Tansu's
    high watermark counts batches, not records, so the end is not asked of the broker.
    The rule holds because the suite reads only once every producer of the topic is
    gone: nothing can arrive after the quiet."""
    consumer = Consumer(
        {
            "bootstrap.servers": brokers,
            "group.id": "orderly-read-back",
            "enable.auto.commit": False,
        }
    )
    meta = consumer.list_topics(topic, timeout=30)
    partitions = sorted(meta.topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    got = 0
    quiet_since = time.monotonic()
    while True:
        m = consumer.poll(0.2)
        now = time.monotonic()
        if m is None:
            quiet = now - quiet_since
            if (got >= expect and quiet > 2) or quiet > 15:
                break
            continue
        quiet_since = now
        if m.error():
            raise SystemExit(f"consumer error: {m.error()}")
        got += 1
        headers = {k: (v or b"").decode() for k, v in (m.headers() or [])}
        print(
            json.dumps(
                {
                    "partition": m.partition(),
                    "offset": m.offset(),
                    "key": (m.key() or b"").decode(),
                    "headers": headers,
                    "value_len": len(m.value() or b""),
                }
            )
        )
    consumer.close()


if __name__ == "__main__":
    brokers, command = sys.argv[1], sys.argv[2]
    if command == "create":
        create(brokers, sys.argv[3], int(sys.argv[4]))
    elif command == "read":
        read(brokers, sys.argv[3], int(sys.argv[4]))
    else:
        raise SystemExit(f"unknown command {command}")
