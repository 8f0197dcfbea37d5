"""The ``pravega-controller`` dialect (protocols/pravega-clients.md §2): every
RPC's answer, the protobuf bytes of the reference's examples (§2.6), the
errors the client must not retry (§2.1), the config rules (§1), and that
all the work happens on the reactor thread.

The gateway runs in-process with a controller (scope ``probe``), a Pravega
and a RustLog listener; gRPC calls are made with grpcio's client from a
thread, as the real clients do from their own runtimes
(test_pravega_real_client.py drives the real one).
"""
import socket
import threading

import grpc
import pytest
from twisted.internet import defer, reactor, threads
from twisted.trial.unittest import TestCase

from gateway import commands as cmd
from gateway.config import ConfigError, parse_config
from gateway.dialects import find_dialects
from gateway.errors import NotAuthorized, StorageError
from gateway.records import RecordBatch
from plugins.pravega_controller import controller_pb2 as pb
from plugins.pravega_controller import server as controller_server
from plugins.pravega_controller.server import SERVICE, key_range
from plugins.rustlog.client import RustLogError, connect as rustlog_connect
from tests.support import gateway_config, start_gateway
from tests.test_pravega_server import PravegaTest

SCOPE = "probe"
Code = grpc.StatusCode


def info(stream, scope=SCOPE):
    return pb.StreamInfo(scope=scope, stream=stream)


def config(stream, segments=1, scope=SCOPE, tags=()):
    return pb.StreamConfig(
        streamInfo=info(stream, scope), scalingPolicy=pb.ScalingPolicy(minNumSegments=segments),
        retentionPolicy=pb.RetentionPolicy(retentionMax=(1 << 63) - 1), tags=pb.Tags(tag=tags))


class ControllerTest(TestCase):
    timeout = 60

    @defer.inlineCallbacks
    def start(self, **sections):
        directory = self.mktemp()
        listeners = [
            {"dialect": "pravega-controller", "endpoint": "tcp:0:interface=127.0.0.1",
             "scope": SCOPE, "segment_store": "127.0.0.1:12345"},
            {"dialect": "pravega", "endpoint": "tcp:0:interface=127.0.0.1", "scope": SCOPE},
            {"dialect": "rustlog", "endpoint": "tcp:0:interface=127.0.0.1"}]
        self.config = gateway_config(directory, listeners, **sections)
        self.service, self.ports = yield start_gateway(self, self.config)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.ports['pravega-controller']}")
        self.addCleanup(self.channel.close)
        self.bus = self.service.bus

    def call(self, rpc, request, response=None, raw=False):
        """One unary call from a thread; fires with the response message (or
        its bytes with ``raw``), fails with the grpc.RpcError."""
        if raw:
            method = self.channel.unary_unary(f"/{SERVICE}/{rpc}")
        else:
            method = self.channel.unary_unary(
                f"/{SERVICE}/{rpc}", request_serializer=type(request).SerializeToString,
                response_deserializer=response.FromString)
        return threads.deferToThread(method, request, timeout=20)

    @defer.inlineCallbacks
    def status(self, rpc, request):
        """The gRPC status code a call fails with, and its details."""
        try:
            yield self.call(rpc, request, raw=True)
        except grpc.RpcError as e:
            return e.code(), e.details()
        raise AssertionError(f"{rpc} did not fail")

    def create(self, topic, partitions=1):
        return self.bus.execute(cmd.CreateTopic(topic, partitions))


class ScopeAndStreamTests(ControllerTest):

    @defer.inlineCallbacks
    def test_scopes(self):
        yield self.start()
        status = pb.CreateScopeStatus.Status
        self.assertEqual((yield self.call("createScope", pb.ScopeInfo(scope=SCOPE),
                                          pb.CreateScopeStatus)).status, status.SCOPE_EXISTS)
        self.assertEqual((yield self.call("createScope", pb.ScopeInfo(scope="other"),
                                          pb.CreateScopeStatus)).status,
                         status.INVALID_SCOPE_NAME)
        for scope, exists in ((SCOPE, True), ("other", False)):
            self.assertEqual((yield self.call("checkScopeExists", pb.ScopeInfo(scope=scope),
                                              pb.ExistsResponse)).exists, exists)
        # §2.6: ScopesResponse{[probe], "end"}, then a page with an empty, present token
        self.assertEqual((yield self.call("listScopes", b"", raw=True)),
                         bytes.fromhex("0a05") + b"probe" + bytes.fromhex("12050a03") + b"end")
        self.assertEqual((yield self.call("listScopes", pb.ScopesRequest(
            continuationToken=pb.ContinuationToken(token="end")).SerializeToString(), raw=True)),
            bytes.fromhex("1200"))
        deleted = pb.DeleteScopeStatus.Status
        self.assertEqual((yield self.call("deleteScope", pb.ScopeInfo(scope=SCOPE),
                                          pb.DeleteScopeStatus)).status, deleted.SUCCESS)
        yield self.create("t")
        self.assertEqual((yield self.call("deleteScope", pb.ScopeInfo(scope=SCOPE),
                                          pb.DeleteScopeStatus)).status, deleted.SCOPE_NOT_EMPTY)
        self.assertEqual((yield self.call("deleteScope", pb.ScopeInfo(scope="other"),
                                          pb.DeleteScopeStatus)).status, deleted.SCOPE_NOT_FOUND)
        self.assertEqual(self.service.store.topic_names(), ["t"])

    @defer.inlineCallbacks
    def test_create_stream(self):
        yield self.start()
        # §2.6: the bytes create_stream("probe", "events", 1) sends; SUCCESS is an empty body
        request = bytes.fromhex("0a0f0a05") + b"probe" + bytes.fromhex("1206") + b"events" + \
            bytes.fromhex("120220011a0a18ffffffffffffffff7f")
        self.assertEqual((yield self.call("createStream", request, raw=True)), b"")
        self.assertEqual((yield self.call("createStream", request, raw=True)),
                         bytes.fromhex("0802"))
        topic = self.service.store.topic("events")
        self.assertEqual((topic.partitions, topic.kind), (1, "undecided"))
        status = pb.CreateStreamStatus.Status
        cases = [(config("three", 3), status.SUCCESS),
                 (config("three", 5), status.STREAM_EXISTS),
                 (config("zero", 0), status.SUCCESS),
                 (config("x", 1, scope="other"), status.SCOPE_NOT_FOUND),
                 (config("bad_name"), status.INVALID_STREAM_NAME),
                 (config("x--a-q"), status.INVALID_STREAM_NAME),
                 (config("x--user-uevents", 2), status.SUCCESS)]
        for request, expected in cases:
            answer = yield self.call("createStream", request, pb.CreateStreamStatus)
            self.assertEqual(answer.status, expected, request.streamInfo.stream)
        store = self.service.store
        self.assertEqual([store.topic(t).partitions for t in ("three", "zero", "user_events")],
                         [3, 1, 2])
        # more partitions than topics.max_partitions: not retried, nothing created
        self.assertEqual((yield self.status("createStream",
                                            config("huge", 5000).SerializeToString()))[0],
                         Code.INVALID_ARGUMENT)
        self.assertNotIn("huge", store.topics)
        for stream, exists in (("three", True), ("x--user-uevents", True), ("nope", False),
                               ("user_events", False)):
            self.assertEqual((yield self.call("checkStreamExists", info(stream),
                                              pb.ExistsResponse)).exists, exists)

    @defer.inlineCallbacks
    def test_configuration_tags_and_listing(self):
        self.patch(controller_server, "PAGE_SIZE", 2)
        yield self.start()
        yield self.call("createStream", config("tagged", 3, tags=["a", "b"]),
                        pb.CreateStreamStatus)
        for topic in ("plain", "with_underscore", "zz"):
            yield self.create(topic)
        got = yield self.call("getStreamConfiguration", info("tagged"), pb.StreamConfig)
        self.assertEqual(got, pb.StreamConfig(
            streamInfo=info("tagged"), scalingPolicy=pb.ScalingPolicy(minNumSegments=3),
            retentionPolicy=pb.RetentionPolicy(retentionMax=(1 << 63) - 1),
            tags=pb.Tags(tag=["a", "b"])))
        # a topic never configured through Pravega: its partition count alone
        got = yield self.call("getStreamConfiguration", info("plain"), pb.StreamConfig)
        self.assertEqual(got, pb.StreamConfig(streamInfo=info("plain"),
                                              scalingPolicy=pb.ScalingPolicy(minNumSegments=1)))
        self.assertFalse(got.HasField("tags"))
        # updateStream stores tags and policies; the partition count stays
        status = pb.UpdateStreamStatus.Status
        update = config("tagged", 1, tags=["c"])
        self.assertEqual((yield self.call("updateStream", update, pb.UpdateStreamStatus)).status,
                         status.SUCCESS)
        got = yield self.call("getStreamConfiguration", info("tagged"), pb.StreamConfig)
        self.assertEqual((list(got.tags.tag), got.scalingPolicy.minNumSegments), (["c"], 3))
        self.assertEqual(self.service.store.topic("tagged").partitions, 3)
        for request, expected in ((config("nope"), status.STREAM_NOT_FOUND),
                                  (config("tagged", scope="other"), status.SCOPE_NOT_FOUND)):
            self.assertEqual((yield self.call("updateStream", request,
                                              pb.UpdateStreamStatus)).status, expected)
        self.assertEqual((yield self.status("getStreamConfiguration",
                                            info("nope").SerializeToString()))[0], Code.NOT_FOUND)
        # pages of PAGE_SIZE, sorted escaped names, then an empty page
        names, token, pages = [], "", 0
        while True:
            page = yield self.call("listStreamsInScope", pb.StreamsInScopeRequest(
                scope=pb.ScopeInfo(scope=SCOPE), continuationToken=pb.ContinuationToken(
                    token=token)), pb.StreamsInScopeResponse)
            self.assertTrue(page.HasField("continuationToken"))
            if not page.streams:
                break
            pages += 1
            names += [s.stream for s in page.streams]
            self.assertEqual({s.scope for s in page.streams}, {SCOPE})
            token = page.continuationToken.token
            self.assertEqual(token, names[-1])
        self.assertEqual((names, pages), (["plain", "tagged", "x--with-uunderscore", "zz"], 2))
        tagged = yield self.call("listStreamsInScopeForTag", pb.StreamsInScopeWithTagRequest(
            scope=pb.ScopeInfo(scope=SCOPE), tag="c"), pb.StreamsInScopeResponse)
        self.assertEqual([s.stream for s in tagged.streams], ["tagged"])
        other = yield self.call("listStreamsInScope", pb.StreamsInScopeRequest(
            scope=pb.ScopeInfo(scope="other")), pb.StreamsInScopeResponse)
        self.assertEqual((other.status, list(other.streams)),
                         (pb.StreamsInScopeResponse.Status.SCOPE_NOT_FOUND, []))

    @defer.inlineCallbacks
    def test_seal_and_delete(self):
        yield self.start()
        yield self.create("t", 2)
        yield self.bus.execute(cmd.Produce("t", 0, RecordBatch([b"a"])))
        deleted = pb.DeleteStreamStatus.Status
        self.assertEqual((yield self.call("deleteStream", info("t"), pb.DeleteStreamStatus)).status,
                         deleted.STREAM_NOT_SEALED)
        sealed = pb.UpdateStreamStatus.Status
        for _ in range(2):      # again when already sealed
            self.assertEqual((yield self.call("sealStream", info("t"),
                                              pb.UpdateStreamStatus)).status, sealed.SUCCESS)
        store = self.service.store
        self.assertTrue(all(store.offsets("t", p).sealed for p in (0, 1)))
        client = yield rustlog_connect(reactor, "127.0.0.1", self.ports["rustlog"])
        self.addCleanup(client.close)
        yield self.assertFailure(client.produce("t", 1, [b"refused"]), RustLogError)
        for request, expected in ((info("nope"), sealed.STREAM_NOT_FOUND),
                                  (info("t", "other"), sealed.SCOPE_NOT_FOUND)):
            self.assertEqual((yield self.call("sealStream", request,
                                              pb.UpdateStreamStatus)).status, expected)
        self.assertEqual((yield self.call("deleteStream", info("t"), pb.DeleteStreamStatus)).status,
                         deleted.SUCCESS)
        self.assertNotIn("t", store.topics)
        for request in (info("t"), info("t", "other")):
            self.assertEqual((yield self.call("deleteStream", request,
                                              pb.DeleteStreamStatus)).status,
                             deleted.STREAM_NOT_FOUND)


class SegmentTests(ControllerTest):

    @defer.inlineCallbacks
    def test_current_segments_tile_the_key_space(self):
        yield self.start()
        yield self.create("multi", 3)
        # §2.6: the first of 3 ranges (segment 0 and minKey 0.0 are omitted)
        raw = yield self.call("getCurrentSegments", info("multi").SerializeToString(), raw=True)
        first = bytes.fromhex("0a1b0a100a0e0a05") + b"probe" + bytes.fromhex("1205") + \
            b"multi" + bytes.fromhex("19555555555555d53f")
        self.assertTrue(raw.startswith(first))
        ranges = pb.SegmentRanges.FromString(raw)
        self.assertEqual([(r.segmentId.segmentId, r.minKey, r.maxKey)
                          for r in ranges.segmentRanges],
                         [(0, 0.0, 1 / 3), (1, 1 / 3, 2 / 3), (2, 2 / 3, 1.0)])
        self.assertEqual(ranges.delegationToken, "")
        epoch = yield self.call("getEpochSegments", pb.GetEpochSegmentsRequest(
            streamInfo=info("multi")), pb.SegmentRanges)
        self.assertEqual(epoch, ranges)
        for n in (1, 2, 3, 7, 10, 1000):
            bounds = [key_range(i, n) for i in range(n)]
            self.assertEqual(bounds[0][0], 0.0)
            self.assertEqual(bounds[-1][1], 1.0)
            self.assertTrue(all(a[1] == b[0] for a, b in zip(bounds, bounds[1:])))
        between = yield self.call("getSegmentsBetween", pb.StreamCutRange(streamInfo=info("multi")),
                                  pb.StreamCutRangeResponse)
        self.assertEqual([s.segmentId for s in between.segments], [0, 1, 2])
        for rpc, request in (("getCurrentSegments", info("nope")),
                             ("getCurrentSegments", info("multi", "other")),
                             ("getEpochSegments", pb.GetEpochSegmentsRequest(
                                 streamInfo=info("multi"), epoch=1)),
                             ("getSegments", pb.GetSegmentsRequest(streamInfo=info("nope"))),
                             ("getSegmentsBetween", pb.StreamCutRange(streamInfo=info("nope")))):
            self.assertEqual((yield self.status(rpc, request.SerializeToString()))[0],
                             Code.NOT_FOUND, rpc)

    @defer.inlineCallbacks
    def test_segment_locations_uris_and_successors(self):
        yield self.start()
        yield self.create("multi", 2)
        # §2.6: getURI for any segment, also a table segment's stream
        request = bytes.fromhex("0a0e0a05") + b"probe" + bytes.fromhex("1205") + b"multi" + \
            bytes.fromhex("1001")
        self.assertEqual((yield self.call("getURI", request, raw=True)),
                         bytes.fromhex("0a09") + b"127.0.0.1" + bytes.fromhex("10b960"))
        for stream in ("rg1_kvtable", "nope"):
            uri = yield self.call("getURI", pb.SegmentId(streamInfo=info(stream)), pb.NodeUri)
            self.assertEqual((uri.endpoint, uri.port), ("127.0.0.1", 12345))
        for rpc in ("getSegmentsImmediatelyFollowing", "getSegmentsImmediatlyFollowing"):
            self.assertEqual((yield self.call(rpc, pb.SegmentId(streamInfo=info("multi")),
                                              pb.SuccessorResponse)), pb.SuccessorResponse())
        for stream, number, valid in (("multi", 1, True), ("multi", 2, False),
                                      ("multi", 1 << 32 | 1, False), ("nope", 0, False)):
            got = yield self.call("isSegmentValid", pb.SegmentId(streamInfo=info(stream),
                                                                 segmentId=number),
                                  pb.SegmentValidityResponse)
            self.assertEqual(got.response, valid)
        self.assertTrue((yield self.call("isStreamCutValid", pb.StreamCut(streamInfo=info("multi")),
                                         pb.StreamCutValidityResponse)).response)
        self.assertEqual((yield self.call("getDelegationToken", info("multi"),
                                          pb.DelegationToken)).delegationToken, "")
        servers = yield self.call("getControllerServerList", pb.ServerRequest(), pb.ServerResponse)
        self.assertEqual([(n.endpoint, n.port) for n in servers.nodeURI],
                         [("127.0.0.1", self.ports["pravega-controller"])])
        self.assertEqual((yield self.call("removeWriter", pb.RemoveWriterRequest(writer="w"),
                                          pb.RemoveWriterResponse)).result, 0)
        self.assertEqual((yield self.call("noteTimestampFromWriter", pb.TimestampFromWriter(),
                                          pb.TimestampResponse)).result, 0)

    @defer.inlineCallbacks
    def test_get_segments_reports_start_positions_after_retention(self):
        yield self.start(storage={"segment_bytes": 1024, "retention": {"bytes": 2048}})
        yield self.create("old", 2)
        for _ in range(30):
            yield self.bus.execute(cmd.Produce("old", 1, RecordBatch([b"v" * 200])))
        self.assertGreater(self.service.store.enforce_retention(), 0)
        start = self.service.store.offsets("old", 1).start_position
        self.assertGreater(start, 0)
        got = yield self.call("getSegments", pb.GetSegmentsRequest(streamInfo=info("old"),
                                                                   timestamp=0),
                              pb.SegmentsAtTime)
        self.assertEqual([(s.segmentId.segmentId, s.offset) for s in got.segments],
                         [(0, 0), (1, start)])


class ErrorAndThreadTests(ControllerTest):

    @defer.inlineCallbacks
    def test_out_of_scope_rpcs_are_unimplemented_with_a_reason(self):
        yield self.start()
        for rpc, words in (("createTransaction", "transactions"), ("scale", "scaling"),
                           ("checkScale", "scaling"), ("truncateStream", "retention"),
                           ("createReaderGroup", "table segments"),
                           ("createKeyValueTable", "key-value tables")):
            code, details = yield self.status(rpc, b"\x0a\x00")
            self.assertEqual(code, Code.UNIMPLEMENTED, rpc)
            self.assertIn(words, details)
        self.assertEqual((yield self.status("noSuchRpc", b""))[0], Code.UNIMPLEMENTED)

    @defer.inlineCallbacks
    def test_every_call_runs_on_the_reactor_thread(self):
        yield self.start()
        seen = set()
        execute = self.bus.execute

        def recording(command):
            seen.add(threading.current_thread())
            return execute(command)
        self.patch(self.bus, "execute", recording)
        yield self.call("createStream", config("s", 2), pb.CreateStreamStatus)
        yield self.call("getSegments", pb.GetSegmentsRequest(streamInfo=info("s")),
                        pb.SegmentsAtTime)
        yield self.call("listStreamsInScope", pb.StreamsInScopeRequest(
            scope=pb.ScopeInfo(scope=SCOPE)), pb.StreamsInScopeResponse)
        self.assertEqual(seen, {threading.main_thread()})

    @defer.inlineCallbacks
    def test_access_refusals_and_failures(self):
        """PERMISSION_DENIED (never retried) for the access rules; INTERNAL,
        logged with its traceback, for a storage failure."""
        yield self.start()
        self.patch(self.bus, "execute", lambda command: defer.fail(NotAuthorized("no")))
        self.assertEqual((yield self.status("getCurrentSegments",
                                            info("s").SerializeToString()))[0],
                         Code.PERMISSION_DENIED)
        self.patch(self.bus, "execute", lambda command: defer.fail(StorageError("disk gone")))
        code, details = yield self.status("getCurrentSegments", info("s").SerializeToString())
        self.assertEqual((code, details), (Code.INTERNAL, "internal error: disk gone"))
        self.flushLoggedErrors()

    @defer.inlineCallbacks
    def test_a_port_in_use_fails_the_listener(self):
        held = socket.socket()
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        self.addCleanup(held.close)
        listeners = [
            {"dialect": "pravega-controller",
             "endpoint": f"tcp:{held.getsockname()[1]}:interface=127.0.0.1",
             "segment_store": "127.0.0.1:12345"},
            {"dialect": "pravega", "endpoint": "tcp:0:interface=127.0.0.1"}]
        config = gateway_config(self.mktemp(), listeners)
        yield self.assertFailure(start_gateway(self, config), RuntimeError)


# -- config (§1) ---------------------------------------------------------------------------------

def listeners(*entries):
    return parse_config({"listeners": list(entries)}, "/tmp", find_dialects()).listeners


PRAVEGA = {"dialect": "pravega", "endpoint": "tcp:0", "scope": "s"}


def controller(**options):
    return {"dialect": "pravega-controller", "endpoint": "tcp:0", "scope": "s",
            "segment_store": "h:12345", **options}


def test_controller_options():
    got = listeners(PRAVEGA, controller())[1].options
    assert dict(got) == {"scope": "s", "segment_store": ("h", 12345), "advertised_address": None}
    got = listeners(PRAVEGA, controller(advertised_address="[::1]:9090",
                                        segment_store="[::1]:1"))[1].options
    assert (got["advertised_address"], got["segment_store"]) == (("[::1]", 9090), ("[::1]", 1))
    assert listeners({"dialect": "pravega", "endpoint": "tcp:0"},
                     {"dialect": "pravega-controller", "endpoint": "tcp6:0",
                      "segment_store": "h:1"})[1].options["scope"] == "gateway"


@pytest.mark.parametrize("entries,message", [
    ((PRAVEGA, controller(scope="t")),
     "listeners[1].scope: must be the scope of a pravega listener ('s'), got 't'"),
    ((controller(),), "listeners[0].scope: must be the scope of a pravega listener (none"),
    ((PRAVEGA, controller(endpoint="unix:/tmp/x")),
     "listeners[1].endpoint: the controller listens with grpcio in cleartext: use a tcp:"),
    ((PRAVEGA, {"dialect": "pravega-controller", "endpoint": "tcp:0", "scope": "s"}),
     "listeners[1].segment_store: required"),
    ((PRAVEGA, controller(segment_store="12345")), "listeners[1].segment_store: must be host:port"),
    ((PRAVEGA, controller(segment_store="h:0")), "listeners[1].segment_store: must be host:port"),
    ((PRAVEGA, controller(advertised_address="h:x")),
     "listeners[1].advertised_address: must be host:port"),
    ((PRAVEGA, controller(scope="a_b")), "listeners[1].scope: must be letters, digits"),
    ((PRAVEGA, controller(segment_stor="h:1")),
     "listeners[1].segment_stor: unknown key (did you mean 'segment_store'?)"),
])
def test_controller_config_errors(entries, message):
    with pytest.raises(ConfigError) as e:
        listeners(*entries)
    assert str(e.value).startswith(message)


class WildcardTests(PravegaTest):
    """On a wildcard interface the controller advertises the segment
    store's host, or ``advertised_address``."""

    @defer.inlineCallbacks
    def test_advertised_address(self):
        for options, expected in (({}, ("localhost", None)),
                                  ({"advertised_address": "ctl.example:7"}, ("ctl.example", 7))):
            directory = self.tempdir()
            config = gateway_config(directory, [
                {"dialect": "pravega", "endpoint": "tcp:0:interface=127.0.0.1"},
                {"dialect": "pravega-controller", "endpoint": "tcp:0",
                 "segment_store": "localhost:12345", **options}])
            service, ports = yield start_gateway(self, config)
            channel = grpc.insecure_channel(f"127.0.0.1:{ports['pravega-controller']}")
            method = channel.unary_unary(f"/{SERVICE}/getControllerServerList",
                                         response_deserializer=pb.ServerResponse.FromString)
            answer = yield threads.deferToThread(method, b"", timeout=20)
            channel.close()
            [node] = answer.nodeURI
            self.assertEqual((node.endpoint, node.port),
                             (expected[0], expected[1] or ports["pravega-controller"]))
            yield service.stopService()
