"""Kafka: the real kafka-python client, unmodified, with a consumer group.

    .venv/bin/pip install kafka-python      # a client, not a gateway dependency
    .venv/bin/python examples/kafka_example.py [--bootstrap 127.0.0.1:9092] [--topic clicks]

Against ``make run``'s gateway. Kafka positions are offsets; the group's
committed offset is shared with every dialect (a RustLog Fetch with
``group_id`` kafka-example starts there). The gateway answers Fetch with
magic-0 messages, so consumers see keys but no timestamps.
"""
import argparse
import uuid

from kafka import KafkaConsumer, KafkaProducer, TopicPartition


def main(bootstrap, topic):
    run = uuid.uuid4().hex[:8].encode()
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    sent = [producer.send(topic, key=b"user-%d" % i, value=run + b" click %d" % i)
            for i in range(3)]
    producer.flush()
    print(f"produced at offsets {[f.get(10).offset for f in sent]}")
    producer.close()

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id="kafka-example",
                             auto_offset_reset="earliest", enable_auto_commit=False)
    mine = 0
    while mine < len(sent):
        for records in consumer.poll(timeout_ms=1000).values():
            for r in records:
                if r.value.startswith(run):     # earlier runs' records are skipped
                    mine += 1
                    print(f"offset {r.offset}: {r.key.decode()} {r.value.decode()}")
    consumer.commit()
    partition = TopicPartition(topic, 0)
    print(f"group kafka-example committed {consumer.committed(partition)}")
    consumer.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="the Kafka listener")
    parser.add_argument("--topic", default="clicks")
    args = parser.parse_args()
    main(args.bootstrap, args.topic)
