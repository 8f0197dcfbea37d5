"""Kafka codec: the reference's hex examples byte for byte (protocols/kafka.md
§4), message sets against kafka-python's own encoders and decoders (an
independent implementation), every codec, and every class of corrupt set."""
import binascii
import gzip
import zlib

from kafka.codec import (
    gzip_encode, lz4_encode, lz4_encode_old_kafka, snappy_encode)
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from twisted.trial.unittest import SynchronousTestCase

from gateway.records import KAFKA_MESSAGE_SET, NEUTRAL, RecordBatch, decode_neutral, \
    encode_neutral
from plugins.kafka import codec as kc


def unhex(text):
    """Hex with spaces and ``#`` comments, as the reference prints it."""
    return binascii.unhexlify("".join(line.split("#")[0].replace(" ", "")
                                      for line in text.strip().splitlines()))


PRODUCE_V0 = unhex("""
    00000043                                # size 67
    0000 0000 00000007 0004 64656d6f        # key 0, version 0, correlation 7, client_id "demo"
    0001 000003e8                           # acks 1, timeout_ms 1000
    00000001 0001 74 00000001 00000000      # 1 topic "t", 1 partition: 0
    0000001c                                # message_set_size 28
    0000000000000000 00000010               # entry offset 0 (ignored), message_size 16
    1fecd70a 00 00                          # crc, magic 0, attributes 0
    00000001 6b 00000001 76                 # key "k", value "v"
""")
PRODUCE_V0_RESPONSE = unhex("""
    0000001d 00000007
    00000001 0001 74 00000001 00000000
    0000 0000000000000029
""")
FETCH_V0 = unhex("""
    00000035 0001 0000 00000008 0004 64656d6f
    ffffffff 000001f4 00000001
    00000001 0001 74 00000001 00000000
    0000000000000029 00100000
""")
FETCH_V0_RESPONSE = unhex("""
    0000003d 00000008
    00000001 0001 74 00000001 00000000
    0000 000000000000002a 0000001c
    0000000000000029 00000010
    1fecd70a 00 00 00000001 6b 00000001 76
""")
MAGIC1_ENTRY = unhex(
    "0000000000000000 00000018 39268c33 01 00 0000018bcfe56800 00000001 6b 00000001 76")
API_VERSIONS_V0 = unhex("0000000e 0012 0000 00000001 0004 64656d6f")
API_VERSIONS_RESPONSE = unhex("""
    0000005e 00000001 0000 0000000e
    0000 0000 0001  0001 0000 0001
    0002 0000 0000  0003 0000 0000
    0008 0000 0002  0009 0000 0001  000a 0000 0000
    000b 0000 0000  000c 0000 0000  000d 0000 0000
    000e 0000 0000
    000f 0000 0000  0010 0000 0000
    0012 0000 0000
""")
API_VERSIONS_V4 = unhex("""
    00000037 0012 0004 00000001
    0017 6b61666b612d707974686f6e2d70726f64756365722d31
    00 0d 6b61666b612d707974686f6e 07 332e302e3132 00
""")
METADATA_RESPONSE = unhex("""
    00000042 00000002
    00000001 00000000 0009 3132372e302e302e31 00002384
    00000001 0000 0001 74
    00000001 0000 00000000 00000000
    00000001 00000000 00000001 00000000
""")
LIST_OFFSETS_RESPONSE = unhex(
    "00000021 00000003 00000001 0001 74 00000001 00000000 0000 00000001 000000000000002a")


class Stored:
    """A stored batch as the bus hands it to a fetch."""

    def __init__(self, base_offset, payload, format=KAFKA_MESSAGE_SET, count=None,
                 first_ts=0):
        self.base_offset = base_offset
        self.payload = payload
        self.format = format
        self.first_ts = first_ts
        self.count = count if count is not None else sum(1 for _ in kc.iter_stored(payload))


def neutral_batch(base_offset, values, keys=None, timestamps=None):
    payload = encode_neutral(RecordBatch(values, keys, timestamps), 5)[0]
    return Stored(base_offset, payload, NEUTRAL, len(values), 5)


def decode_other(batch):
    return decode_neutral(batch.payload, batch)


def kafka_python_set(records, magic, compression=0):
    """A message set built by kafka-python's own record builder."""
    builder = LegacyRecordBatchBuilder(magic, compression, 1 << 20)
    for i, (key, value, ts) in enumerate(records):
        builder.append(i, ts if magic else None, key, value)
    return bytes(builder.build())


def kafka_python_read(data):
    """(offset, key, value) of every message, CRCs checked, by kafka-python."""
    out = []
    records = MemoryRecords(data)
    while records.has_next():
        batch = records.next_batch()
        for record in batch:
            assert record.validate_crc()
            out.append((record.offset, record.key, record.value))
    return out


class ReferenceExamples(SynchronousTestCase):

    def test_produce_request(self):
        request = kc.decode_request(PRODUCE_V0[4:])
        self.assertEqual((request.api_key, request.api_version, request.correlation_id,
                          request.client_id), (0, 0, 7, "demo"))
        self.assertEqual(request.body.acks, 1)
        self.assertEqual(request.body.timeout_ms, 1000)
        (name, ((partition, data),)), = request.body.topics
        self.assertEqual((name, partition, len(data)), ("t", 0, 28))
        produced = kc.read_produced(data, 99, 1 << 20)
        self.assertEqual((produced.payload, produced.count), (data, 1))
        self.assertEqual(kc.encode_request(0, 0, 7, "demo", request.body), PRODUCE_V0)

    def test_produce_responses(self):
        body = kc.ProduceResponse((("t", ((0, 0, 41),)),))
        self.assertEqual(kc.encode_response(0, 0, 7, body), PRODUCE_V0_RESPONSE)
        v1 = kc.encode_response(0, 1, 7, body)
        self.assertEqual(v1, b"\x00\x00\x00\x21" + PRODUCE_V0_RESPONSE[4:] + b"\x00" * 4)
        self.assertEqual(kc.decode_response(0, 1, v1[4:]), (7, body))

    def test_fetch_request_and_response(self):
        request = kc.decode_request(FETCH_V0[4:])
        self.assertEqual(request.body, kc.FetchRequest(-1, 500, 1, (("t", ((0, 41, 1048576),)),)))
        stored = Stored(41, PRODUCE_V0[-28:])
        data = kc.message_set_for([stored], 41, 1048576, None)
        body = kc.FetchResponse((("t", ((0, 0, 42, data),)),))
        self.assertEqual(kc.encode_response(1, 0, 8, body), FETCH_V0_RESPONSE)
        v1 = kc.encode_response(1, 1, 8, body)
        self.assertEqual(v1, b"\x00\x00\x00\x41" + FETCH_V0_RESPONSE[4:8] + b"\x00" * 4
                         + FETCH_V0_RESPONSE[8:])

    def test_magic1_entry(self):
        self.assertEqual(kc.encode_entry(0, b"k", b"v", 1, 0, 1700000000000), MAGIC1_ENTRY)
        produced = kc.read_produced(MAGIC1_ENTRY, 5, 1 << 20)
        self.assertIsNone(produced.payload)
        self.assertEqual((produced.keys, produced.values, produced.timestamps),
                         ([b"k"], [b"v"], [1700000000000]))

    def test_api_versions(self):
        request = kc.decode_request(API_VERSIONS_V0[4:])
        self.assertEqual((request.api_key, request.api_version, request.correlation_id,
                          request.client_id), (18, 0, 1, "demo"))
        self.assertEqual(kc.encode_response(18, 0, 1, kc.api_versions_body()),
                         API_VERSIONS_RESPONSE)
        flexible = kc.decode_request(API_VERSIONS_V4[4:])
        self.assertEqual((flexible.api_key, flexible.api_version, flexible.correlation_id,
                          flexible.client_id), (18, 4, 1, "kafka-python-producer-1"))
        refused = kc.encode_response(18, 0, 1, kc.api_versions_body(kc.UNSUPPORTED_VERSION))
        self.assertEqual(refused, API_VERSIONS_RESPONSE[:8] + b"\x00\x23"
                         + API_VERSIONS_RESPONSE[10:])

    def test_metadata_and_list_offsets_responses(self):
        body = kc.MetadataResponse(((0, "127.0.0.1", 9092),),
                                   ((0, "t", ((0, 0, 0, (0,), (0,)),)),))
        self.assertEqual(kc.encode_response(3, 0, 2, body), METADATA_RESPONSE)
        offsets = kc.ListOffsetsResponse((("t", ((0, 0, (42,)),)),))
        self.assertEqual(kc.encode_response(2, 0, 3, offsets), LIST_OFFSETS_RESPONSE)

    def test_lz4_header_checksum(self):
        header = unhex("04224d18 60 40 1a")
        self.assertEqual(kc.fix_lz4_header(header + b"\x00" * 4)[:7], unhex("04224d18 60 40 82"))


class ProducedSets(SynchronousTestCase):

    RECORDS = [(b"k0", b"v0", 1000), (None, b"", 1001), (b"", b"value-2" * 30, -1)]

    def test_kafka_python_magic0_sets_every_codec(self):
        for compression in (0, 1, 2, 3):
            data = kafka_python_set(self.RECORDS, 0, compression)
            produced = kc.read_produced(data, 77, 1 << 20)
            self.assertIsNotNone(produced.payload, compression)
            self.assertEqual(list(kc.iter_stored(produced.payload)),
                             [(k, v) for k, v, _ in self.RECORDS])
            self.assertEqual((produced.count, produced.max_value), (3, 210))
            self.assertEqual(produced.value_bytes, 2 + 0 + 210)

    def test_kafka_python_magic1_sets_keep_timestamps(self):
        for compression in (0, 1, 2, 3):
            data = kafka_python_set(self.RECORDS, 1, compression)
            produced = kc.read_produced(data, 77, 1 << 20)
            self.assertIsNone(produced.payload)
            self.assertEqual(produced.keys, [b"k0", None, b""])
            self.assertEqual(produced.values, [b"v0", b"", b"value-2" * 30])
            self.assertEqual(produced.timestamps, [1000, 1001, 77])

    def test_client_compression_functions(self):
        inner = b"".join(kc.encode_entry(i, None, b"x%d" % i) for i in range(4))
        frames = {
            "gzip": (kc.CODEC_GZIP, gzip_encode(inner)),
            "xerial snappy": (kc.CODEC_SNAPPY, snappy_encode(inner, xerial_compatible=True,
                                                             xerial_blocksize=16)),
            "raw snappy": (kc.CODEC_SNAPPY, snappy_encode(inner, xerial_compatible=False)),
            "lz4, broken header checksum": (kc.CODEC_LZ4, lz4_encode_old_kafka(inner)),
            "lz4, correct frame": (kc.CODEC_LZ4, lz4_encode(inner)),
            "gzip, two members": (kc.CODEC_GZIP, gzip.compress(inner[:30]) +
                                  gzip.compress(inner[30:])),
        }
        for name, (codec, value) in frames.items():
            wrapper = kc.encode_entry(0, None, value, 0, codec)
            produced = kc.read_produced(wrapper, 1, 1 << 20)
            self.assertEqual([v for _, v in kc.iter_stored(produced.payload)],
                             [b"x0", b"x1", b"x2", b"x3"], name)

    def test_afkak_style_wrappers_and_mixed_sets(self):
        """afkak sends all inner offsets 0; a set may mix plain messages and
        wrappers; a null value is stored as empty, a null key stays null."""
        inner = b"".join(kc.encode_entry(0, b"k", b"w%d" % i) for i in range(3))
        data = (kc.encode_entry(5, None, None) +
                kc.encode_entry(0, None, kc.compress(kc.CODEC_SNAPPY, inner, xerial=False),
                                0, kc.CODEC_SNAPPY) +
                kc.encode_entry(9, b"z", b"last", 0, 0x10))
        produced = kc.read_produced(data, 1, 1 << 20)
        self.assertEqual(list(kc.iter_stored(produced.payload)),
                         [(None, b""), (b"k", b"w0"), (b"k", b"w1"), (b"k", b"w2"),
                          (b"z", b"last")])
        self.assertEqual(produced.count, 5)
        self.assertEqual(kafka_python_read(produced.payload)[-1][1:], (b"z", b"last"))

    def test_magic1_wrapper_log_append_time_and_mixed_magics(self):
        inner = b"".join(kc.encode_entry(i, None, b"v", 1, 0, 50 + i) for i in range(2))
        wrapper = kc.encode_entry(1, None, kc.compress(kc.CODEC_GZIP, inner), 1,
                                  kc.CODEC_GZIP | kc.TIMESTAMP_LOG_APPEND, 99)
        produced = kc.read_produced(kc.encode_entry(0, b"a", b"b") + wrapper, 7, 1 << 20)
        self.assertEqual(produced.timestamps, [7, 7, 7])
        self.assertEqual(produced.keys, [b"a", None, None])

    def test_empty_set(self):
        produced = kc.read_produced(b"", 1, 100)
        self.assertEqual((produced.payload, produced.count), (b"", 0))

    def corrupt(self, data, limit=1 << 20):
        with self.assertRaises(kc.CorruptMessage) as caught:
            kc.read_produced(data, 1, limit)
        return str(caught.exception)

    def test_corrupt_sets(self):
        good = kc.encode_entry(0, b"k", b"v")
        bad_crc = bytearray(good)
        bad_crc[-1] ^= 1
        self.assertIn("CRC", self.corrupt(bytes(bad_crc)))
        self.assertIn("CRC", self.corrupt(good + bytes(bad_crc)))
        self.corrupt(good[:-1])                                 # entry cut off
        self.corrupt(good + good[:8])                           # a torn header
        magic2 = bytearray(good)
        magic2[16] = 2
        self.assertIn("magic", self.corrupt(bytes(magic2)))
        lying = bytearray(kc.encode_entry(0, b"k", b"vv"))
        lying[-3] = 9    # the value length no longer matches message_size
        self.corrupt(_recrc(bytes(lying)))
        self.corrupt(_recrc(kc.encode_entry(0, None, b"x", 0, 4)))     # codec 4 (zstd)
        self.corrupt(kc.encode_entry(0, None, b"not gzip", 0, kc.CODEC_GZIP))
        self.corrupt(kc.encode_entry(0, None, None, 0, kc.CODEC_GZIP))
        self.corrupt(kc.encode_entry(0, None, kc.compress(kc.CODEC_GZIP, b""), 0,
                                     kc.CODEC_GZIP))                   # empty wrapper
        nested = kc.encode_entry(0, None, kc.compress(kc.CODEC_GZIP, good), 0, kc.CODEC_GZIP)
        self.assertIn("nested", self.corrupt(
            kc.encode_entry(0, None, kc.compress(kc.CODEC_GZIP, nested), 0, kc.CODEC_GZIP)))
        magic1_inside = kc.encode_entry(0, None, b"v", 1, 0, 5)
        self.assertIn("magic 1 inside", self.corrupt(kc.encode_entry(
            0, None, kc.compress(kc.CODEC_SNAPPY, magic1_inside), 0, kc.CODEC_SNAPPY)))
        truncated_gzip = kc.compress(kc.CODEC_GZIP, good)[:-4]
        self.corrupt(kc.encode_entry(0, None, truncated_gzip, 0, kc.CODEC_GZIP))
        self.corrupt(kc.encode_entry(0, None, b"\x04\x22\x4d\x18\x60", 0, kc.CODEC_LZ4))

    def test_compression_bombs_are_refused(self):
        inner = kc.encode_entry(0, None, bytes(100000))
        for codec in (kc.CODEC_GZIP, kc.CODEC_SNAPPY, kc.CODEC_LZ4):
            wrapper = kc.encode_entry(0, None, kc.compress(codec, inner), 0, codec)
            self.assertIn("beyond", self.corrupt(wrapper, limit=50000))
            self.assertEqual(kc.read_produced(wrapper, 1, 200000).count, 1)
            # the limit is for the whole set, not for each wrapper
            self.assertIn("beyond", self.corrupt(wrapper * 3, limit=250000))


def _recrc(entry):
    """The entry with its CRC recomputed (to get past the CRC check)."""
    return entry[:12] + zlib.crc32(entry[16:]).to_bytes(4, "big") + entry[16:]


class FetchedSets(SynchronousTestCase):

    def stored(self, base, values):
        return Stored(base, b"".join(kc.encode_entry(999, None, v) for v in values))

    def test_offsets_are_rewritten_to_absolute(self):
        batches = [self.stored(10, [b"a", b"b"]), self.stored(12, [b"c"])]
        data = kc.message_set_for(batches, 10, 1 << 20, None)
        self.assertEqual(kafka_python_read(data), [(10, None, b"a"), (11, None, b"b"),
                                                   (12, None, b"c")])

    def test_fetch_inside_a_batch_skips_its_head(self):
        data = kc.message_set_for([self.stored(10, [b"a", b"b", b"c"])], 11, 1 << 20, None)
        self.assertEqual([m.offset for m in kc.decode_message_set(data)], [11, 12])

    def test_whole_messages_only_and_the_first_always(self):
        values = [b"x" * 50] * 4
        entry = 12 + 14 + 50
        batches = [self.stored(0, values[:2]), self.stored(2, values[2:])]
        for max_bytes, count in ((entry - 1, 1), (entry, 1), (entry * 3 - 1, 2),
                                 (entry * 3, 3), (1 << 20, 4)):
            data = kc.message_set_for(batches, 0, max_bytes, None)
            self.assertEqual(len(data), entry * count, max_bytes)
        self.assertEqual(kc.message_set_for(batches, 0, 0, None), b"")
        big = self.stored(0, [b"y" * 5000])
        self.assertEqual(len(kc.message_set_for([big], 0, 1024, None)), 12 + 14 + 5000)

    def test_other_formats_are_transcoded_to_magic0(self):
        batch = neutral_batch(40, [b"one", b"two", b"three"], [None, b"", b"k"], [1, 2, 3])
        data = kc.message_set_for([batch], 41, 1 << 20, decode_other)
        self.assertEqual(kafka_python_read(data), [(41, b"", b"two"), (42, b"k", b"three")])
        first_only = kc.message_set_for([batch], 40, 10, decode_other)
        self.assertEqual(kafka_python_read(first_only), [(40, None, b"one")])

    def test_stored_format_decoder(self):
        batch = self.stored(7, [b"a", b"bb"])
        batch.first_ts = 1234
        records = kc.decode_stored(batch.payload, batch)
        self.assertEqual(list(records), [(7, 1234, None, b"a"), (8, 1234, None, b"bb")])

    def test_client_decodes_broker_style_wrappers(self):
        """A real broker serves magic-0 wrappers with absolute inner offsets,
        magic-1 wrappers with relative ones, and may cut the last entry."""
        inner0 = b"".join(kc.encode_entry(20 + i, None, b"m%d" % i) for i in range(3))
        w0 = kc.encode_entry(22, None, kc.compress(kc.CODEC_GZIP, inner0), 0, kc.CODEC_GZIP)
        inner1 = b"".join(kc.encode_entry(i, None, b"n%d" % i, 1, 0, 9) for i in range(2))
        w1 = kc.encode_entry(24, None, kc.compress(kc.CODEC_LZ4, inner1), 1, kc.CODEC_LZ4)
        got = kc.decode_message_set(w0 + w1 + w0[:20])
        self.assertEqual([(m.offset, m.value) for m in got],
                         [(20, b"m0"), (21, b"m1"), (22, b"m2"), (23, b"n0"), (24, b"n1")])
        self.assertEqual(got[-1].timestamp, 9)
