"""The Pravega controller endpoint: gRPC RPCs <-> bus commands
(shared/protocols/pravega-clients.md; §n below are that sheet's sections).

Two halves, one per thread world:

- ``Controller`` holds the RPCs' logic and runs on the reactor thread only:
  each method takes a request message, executes bus commands and answers a
  response message (or a Deferred of one). It is the only part that touches
  the bus.
- ``ControllerService`` wraps a ``grpcio`` server (HTTP/2, framing, flow
  control, its own thread pool). Every handler hands its request to the
  reactor with ``blockingCallFromThread`` and waits there for the answer, so
  no gRPC thread ever touches bus or store state (§1).

The service's RPC table is read from the ``ControllerService`` descriptor of
``controller_pb2`` (generated from ``controller.proto``): each rpc is served
by the ``Controller`` method of the same name, with the request and
response classes the descriptor names, so the .proto and this module cannot
drift apart silently (a missing method fails at start). RPCs the gateway
does not serve are answered UNIMPLEMENTED with the reason (``OUT_OF_SCOPE``);
the client does not retry that code (§2.1), so they fail at once. Every
other unknown method gets grpcio's own UNIMPLEMENTED.

Streams are topics (§1): the listener's one scope, stream = escaped topic
name (pravega.md §8), a stream of N segments is a topic of N partitions with
fixed key ranges, segment i = partition i at epoch 0, forever.
"""
from concurrent import futures

import grpc
from google.protobuf import message_factory
from twisted.application.service import Service
from twisted.internet import defer, threads
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.endpoints import TCP6ServerEndpoint, serverFromString
from twisted.logger import Logger

from gateway import commands as c
from gateway.errors import (
    InvalidRequest,
    InvalidTopicName,
    LogError,
    NotAuthorized,
    TopicExists,
    UnknownTopic,
)
from gateway.listeners import ReportsAddress
from plugins.pravega.codec import escape_stream, unescape_stream
from plugins.pravega_controller import controller_pb2 as pb

log = Logger()

PACKAGE = "io.pravega.controller.stream.api.grpc.v1"
SERVICE = f"{PACKAGE}.ControllerService"
#: streams per listStreamsInScope page
PAGE_SIZE = 1000
#: the gRPC threads: each one waits for the reactor, which does the work
WORKER_THREADS = 8
#: how long a stopping listener lets calls in progress finish
STOP_GRACE_SECONDS = 2.0
#: the attribute key under which a topic keeps its Pravega stream configuration
ATTRS_KEY = "pravega"

#: RPCs outside the gateway's scope, with the reason the client is told.
#: UNIMPLEMENTED is never retried (§2.1): the call fails at once.
OUT_OF_SCOPE = {
    **{rpc: "transactions are not supported by the log gateway"
       for rpc in ("createTransaction", "commitTransaction", "abortTransaction",
                   "pingTransaction", "checkTransactionState")},
    **{rpc: "streams have a fixed number of segments: no scaling"
       for rpc in ("scale", "checkScale")},
    "truncateStream": "retention is the gateway's (storage.retention): no truncation",
    **{rpc: "reader groups keep their state in table segments here (as the Rust and "
            "Python clients do), not in the controller"
       for rpc in ("createReaderGroup", "getReaderGroupConfig", "updateReaderGroup",
                   "deleteReaderGroup", "listSubscribers", "updateSubscriberStreamCut")},
    **{rpc: "key-value tables are not supported by the log gateway"
       for rpc in ("createKeyValueTable", "getKeyValueTableConfiguration",
                   "listKeyValueTablesInScope", "deleteKeyValueTable")},
}


class RpcError(Exception):
    """Answer the call with gRPC status ``code`` and ``message``."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


def key_range(index, count):
    """Segment ``index`` of ``count``: [i/N, (i+1)/N), the last one ending at
    exactly 1.0, so the ranges tile [0, 1) as the client's routing needs
    (§4.1 rule 11). Neighbours share one computed boundary."""
    return index / count, 1.0 if index == count - 1 else (index + 1) / count


class Controller:
    """The RPCs, answered on the reactor thread from bus commands.

    ``scope`` is the one scope served; ``segment_store`` the ``(host, port)``
    every getURI answers; ``own_address`` a callable giving this listener's
    advertised ``(host, port)`` once it listens.
    """

    def __init__(self, bus, scope, segment_store, own_address):
        self.bus = bus
        self.scope = scope
        self.segment_store = segment_store
        self.own_address = own_address

    # -- helpers -------------------------------------------------------------------------

    def _stream_info(self, stream):
        return pb.StreamInfo(scope=self.scope, stream=stream)

    @defer.inlineCallbacks
    def _topic(self, info):
        """``(topic, TopicInfo)`` of a StreamInfo, or None when the scope is
        not ours, the name is not a stream name, or no such topic exists."""
        if info.scope != self.scope:
            return None
        topic = unescape_stream(info.stream)
        if topic is None:
            return None
        [meta] = yield self.bus.execute(c.Metadata([topic]))
        if isinstance(meta.error, (UnknownTopic, InvalidTopicName)):
            return None
        if meta.error is not None:
            raise meta.error
        return topic, meta.info

    @defer.inlineCallbacks
    def _existing(self, info):
        """Like ``_topic``, but an unknown stream is NOT_FOUND (not retried)."""
        found = yield self._topic(info)
        if found is None:
            raise RpcError(grpc.StatusCode.NOT_FOUND,
                           f"stream {info.scope}/{info.stream} does not exist")
        return found

    def _segment_ids(self, stream, count):
        info = self._stream_info(stream)
        return [pb.SegmentId(streamInfo=info, segmentId=i) for i in range(count)]

    def _ranges(self, stream, count):
        ranges = []
        for segment_id in self._segment_ids(stream, count):
            low, high = key_range(segment_id.segmentId, count)
            ranges.append(pb.SegmentRange(segmentId=segment_id, minKey=low, maxKey=high))
        return pb.SegmentRanges(segmentRanges=ranges)

    @staticmethod
    def _stream_attrs(config):
        """What a topic keeps of a StreamConfig (tags and policies, which the
        gateway does not apply: its retention and partition count are its own)."""
        scaling, retention = config.scalingPolicy, config.retentionPolicy
        return {
            "scaling": {"type": scaling.scaleType, "target_rate": scaling.targetRate,
                        "scale_factor": scaling.scaleFactor,
                        "min_segments": scaling.minNumSegments},
            "retention": {"type": retention.retentionType, "param": retention.retentionParam,
                          "max": retention.retentionMax},
            "tags": list(config.tags.tag),
        }

    @staticmethod
    def _tags(topic_info):
        return topic_info.attrs.get(ATTRS_KEY, {}).get("tags", [])

    # -- scopes (§2.4) ------------------------------------------------------------------------

    def createScope(self, request):
        status = pb.CreateScopeStatus.Status
        if request.scope == self.scope:
            return pb.CreateScopeStatus(status=status.SCOPE_EXISTS)
        return pb.CreateScopeStatus(status=status.INVALID_SCOPE_NAME)

    def checkScopeExists(self, request):
        return pb.ExistsResponse(exists=request.scope == self.scope)

    def listScopes(self, request):
        if request.continuationToken.token == "":
            return pb.ScopesResponse(scopes=[self.scope],
                                     continuationToken=pb.ContinuationToken(token="end"))
        return pb.ScopesResponse(continuationToken=pb.ContinuationToken())

    @defer.inlineCallbacks
    def deleteScope(self, request):
        """The scope itself never goes away; deleting it only says whether
        it still holds streams."""
        status = pb.DeleteScopeStatus.Status
        if request.scope != self.scope:
            return pb.DeleteScopeStatus(status=status.SCOPE_NOT_FOUND)
        topics = yield self.bus.execute(c.Metadata())
        return pb.DeleteScopeStatus(status=status.SCOPE_NOT_EMPTY if topics else status.SUCCESS)

    # -- streams (§2.4) ---------------------------------------------------------------------------

    @defer.inlineCallbacks
    def createStream(self, config):
        """A new topic of max(1, minNumSegments) partitions, ``undecided``
        until its first append (§1); the config is kept for
        getStreamConfiguration. An existing topic is left as it is."""
        status = pb.CreateStreamStatus.Status
        info = config.streamInfo
        if info.scope != self.scope:
            return pb.CreateStreamStatus(status=status.SCOPE_NOT_FOUND)
        topic = unescape_stream(info.stream)
        if topic is None:
            return pb.CreateStreamStatus(status=status.INVALID_STREAM_NAME)
        count = max(1, config.scalingPolicy.minNumSegments)
        try:
            yield self.bus.execute(c.CreateTopic(topic, count, kind="undecided",
                                                 attrs={ATTRS_KEY: self._stream_attrs(config)}))
        except TopicExists:
            return pb.CreateStreamStatus(status=status.STREAM_EXISTS)
        except InvalidTopicName:
            return pb.CreateStreamStatus(status=status.INVALID_STREAM_NAME)
        except InvalidRequest as e:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        return pb.CreateStreamStatus()

    @defer.inlineCallbacks
    def checkStreamExists(self, info):
        return pb.ExistsResponse(exists=(yield self._topic(info)) is not None)

    @defer.inlineCallbacks
    def getStreamConfiguration(self, info):
        """The stored retention policy and tags; the scaling policy is
        always FIXED with the topic's current partition count."""
        topic, topic_info = yield self._existing(info)
        stored = topic_info.attrs.get(ATTRS_KEY, {})
        config = pb.StreamConfig(
            streamInfo=self._stream_info(info.stream),
            scalingPolicy=pb.ScalingPolicy(
                scaleType=pb.ScalingPolicy.ScalingPolicyType.FIXED_NUM_SEGMENTS,
                minNumSegments=topic_info.partitions))
        retention = stored.get("retention")
        if retention is not None:
            config.retentionPolicy.CopyFrom(pb.RetentionPolicy(
                retentionType=retention["type"], retentionParam=retention["param"],
                retentionMax=retention["max"]))
        if "tags" in stored:
            config.tags.CopyFrom(pb.Tags(tag=stored["tags"]))
        return config

    @defer.inlineCallbacks
    def updateStream(self, config):
        """Tags and policies are stored; the partition count never changes."""
        status = pb.UpdateStreamStatus.Status
        if config.streamInfo.scope != self.scope:
            return pb.UpdateStreamStatus(status=status.SCOPE_NOT_FOUND)
        found = yield self._topic(config.streamInfo)
        if found is None:
            return pb.UpdateStreamStatus(status=status.STREAM_NOT_FOUND)
        yield self.bus.execute(c.SetTopicAttrs(found[0], {ATTRS_KEY: self._stream_attrs(config)}))
        return pb.UpdateStreamStatus()

    def listStreamsInScope(self, request):
        return self._list(request.scope.scope, request.continuationToken.token, None)

    def listStreamsInScopeForTag(self, request):
        return self._list(request.scope.scope, request.continuationToken.token, request.tag)

    @defer.inlineCallbacks
    def _list(self, scope, token, tag):
        """Every topic (with ``tag``, if given) as an escaped stream name,
        sorted; pages of PAGE_SIZE after ``token`` (the last name of the
        previous page). The client stops at the first empty page, which
        carries a token too."""
        if scope != self.scope:
            return pb.StreamsInScopeResponse(
                status=pb.StreamsInScopeResponse.Status.SCOPE_NOT_FOUND,
                continuationToken=pb.ContinuationToken(token=token))
        metas = yield self.bus.execute(c.Metadata())
        names = sorted(escape_stream(m.name) for m in metas
                       if m.info is not None and (tag is None or tag in self._tags(m.info)))
        page = [name for name in names if name > token][:PAGE_SIZE]
        return pb.StreamsInScopeResponse(
            streams=[self._stream_info(name) for name in page],
            continuationToken=pb.ContinuationToken(token=page[-1] if page else token))

    @defer.inlineCallbacks
    def sealStream(self, info):
        """Seals every partition through the bus, for every dialect; SUCCESS
        once durable, also when it already was sealed."""
        status = pb.UpdateStreamStatus.Status
        if info.scope != self.scope:
            return pb.UpdateStreamStatus(status=status.SCOPE_NOT_FOUND)
        found = yield self._topic(info)
        if found is None:
            return pb.UpdateStreamStatus(status=status.STREAM_NOT_FOUND)
        topic, topic_info = found
        yield defer.gatherResults(
            [self.bus.execute(c.SealPartition(topic, p)) for p in range(topic_info.partitions)],
            consumeErrors=True).addErrback(lambda f: f.value.subFailure)
        return pb.UpdateStreamStatus()

    @defer.inlineCallbacks
    def deleteStream(self, info):
        """Only a sealed stream is deleted (as Pravega requires)."""
        status = pb.DeleteStreamStatus.Status
        found = yield self._topic(info)
        if found is None:
            return pb.DeleteStreamStatus(status=status.STREAM_NOT_FOUND)
        topic, topic_info = found
        for p in range(topic_info.partitions):
            state = yield self.bus.execute(c.PartitionInfo(topic, p))
            if not state.sealed:
                return pb.DeleteStreamStatus(status=status.STREAM_NOT_SEALED)
        try:
            yield self.bus.execute(c.DeleteTopic(topic))
        except UnknownTopic:
            return pb.DeleteStreamStatus(status=status.STREAM_NOT_FOUND)
        return pb.DeleteStreamStatus()

    # -- segments (§2.4) -------------------------------------------------------------------------

    @defer.inlineCallbacks
    def getCurrentSegments(self, info):
        _, topic_info = yield self._existing(info)
        return self._ranges(info.stream, topic_info.partitions)

    @defer.inlineCallbacks
    def getEpochSegments(self, request):
        _, topic_info = yield self._existing(request.streamInfo)
        if request.epoch != 0:
            raise RpcError(grpc.StatusCode.NOT_FOUND,
                           f"epoch {request.epoch}: streams here only have epoch 0")
        return self._ranges(request.streamInfo.stream, topic_info.partitions)

    @defer.inlineCallbacks
    def getSegments(self, request):
        """Every partition at its current start position (the Pravega view),
        whatever the timestamp: a reader group starts there, never below
        the retention start (§4.1 rule 5)."""
        topic, topic_info = yield self._existing(request.streamInfo)
        locations = []
        for segment_id in self._segment_ids(request.streamInfo.stream, topic_info.partitions):
            state = yield self.bus.execute(c.PartitionInfo(topic, segment_id.segmentId))
            locations.append(pb.SegmentsAtTime.SegmentLocation(segmentId=segment_id,
                                                               offset=state.start_position))
        return pb.SegmentsAtTime(segments=locations)

    def getSegmentsImmediatelyFollowing(self, request):
        """No segment has successors, ever; an error here would make the
        reader panic (§4.1 rule 6)."""
        return pb.SuccessorResponse()

    getSegmentsImmediatlyFollowing = getSegmentsImmediatelyFollowing

    @defer.inlineCallbacks
    def getSegmentsBetween(self, request):
        _, topic_info = yield self._existing(request.streamInfo)
        return pb.StreamCutRangeResponse(
            segments=self._segment_ids(request.streamInfo.stream, topic_info.partitions))

    def getURI(self, request):
        """The segment store, for any segment: also for table segments and
        streams that are not topics."""
        host, port = self.segment_store
        return pb.NodeUri(endpoint=host, port=port)

    @defer.inlineCallbacks
    def isSegmentValid(self, request):
        found = yield self._topic(request.streamInfo)
        number = request.segmentId
        valid = found is not None and 0 <= number < found[1].partitions
        return pb.SegmentValidityResponse(response=valid)

    def isStreamCutValid(self, request):
        return pb.StreamCutValidityResponse(response=True)

    def getDelegationToken(self, request):
        return pb.DelegationToken()

    def getControllerServerList(self, request):
        host, port = self.own_address()
        return pb.ServerResponse(nodeURI=[pb.NodeUri(endpoint=host, port=port)])

    def removeWriter(self, request):
        return pb.RemoveWriterResponse()

    def noteTimestampFromWriter(self, request):
        return pb.TimestampResponse()

    # -- the calls ------------------------------------------------------------------------------

    def call(self, method, request):
        """Run one RPC on the reactor; its failure is always an RpcError.

        A refusal by the access rules is PERMISSION_DENIED, which the client
        does not retry. Anything else unexpected (a bug, a storage failure)
        is logged with its traceback and answered INTERNAL.
        """
        def failed(failure):
            if failure.check(RpcError):
                return failure
            if failure.check(NotAuthorized):
                raise RpcError(grpc.StatusCode.PERMISSION_DENIED, str(failure.value))
            if not failure.check(LogError):
                log.failure("pravega-controller {method} failed", failure,
                            method=method.__name__)
            else:
                log.error("pravega-controller {method}: {error}", method=method.__name__,
                          error=str(failure.value))
            raise RpcError(grpc.StatusCode.INTERNAL, f"internal error: {failure.value}")
        return defer.maybeDeferred(method, request).addErrback(failed)


def out_of_scope(reason):
    def refuse(request):
        raise RpcError(grpc.StatusCode.UNIMPLEMENTED, reason)
    refuse.__name__ = "out_of_scope"
    return refuse


def grpc_address(endpoint, reactor):
    """``(bind address for grpcio, host, port)`` of a ``tcp:``/``tcp6:``
    Twisted endpoint string (check_listeners allows no other kind).

    Twisted keeps no public record of an endpoint's port and interface:
    ``_port`` and ``_interface`` are what its TCP endpoints store (config.py
    reads ``_port`` the same way)."""
    parsed = serverFromString(reactor, endpoint)
    host, port = parsed._interface, parsed._port
    if isinstance(parsed, TCP6ServerEndpoint):
        return f"[{host or '::'}]:{port}", host or "::", port
    return f"{host or '0.0.0.0'}:{port}", host or "0.0.0.0", port


class ControllerService(ReportsAddress, Service):
    """One ``pravega-controller`` listener: a grpcio server whose handlers
    hand every call to ``controller`` on the reactor thread.

    ``whenListening()`` fires with the bound address (port 0 learns its
    port) or fails if the port cannot be bound. Stopping refuses new calls
    and lets the ones in progress finish for up to STOP_GRACE_SECONDS; the
    reactor keeps running meanwhile, which they need.
    """

    def __init__(self, listener, bus, options, reactor):
        self.listener = listener
        self.reactor = reactor
        self.options = options
        self.server = None
        self.address = None
        self.error = None
        self._waiting = []
        host, port = options["segment_store"]
        self.controller = Controller(bus, options["scope"], (host, port), self._advertised)
        self.setName(f"{listener.dialect}@{listener.path}")

    def _advertised(self):
        """This listener's address for getControllerServerList: the option,
        else the bound one (a wildcard interface reached as the segment
        store's host, which clients can reach)."""
        if self.options.get("advertised_address") is not None:
            return self.options["advertised_address"]
        host = self.address.host
        if host in ("0.0.0.0", "::"):
            host = self.options["segment_store"][0]
        return host, self.address.port

    def _handlers(self):
        """The RPC table: every rpc of the .proto's service, then the
        out-of-scope ones (which need no message types: their requests are
        never parsed)."""
        service = pb.DESCRIPTOR.services_by_name["ControllerService"]
        handlers = {}
        for method in service.methods:
            logic = getattr(self.controller, method.name)
            request_class = message_factory.GetMessageClass(method.input_type)
            response_class = message_factory.GetMessageClass(method.output_type)
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                self._serve(logic), request_deserializer=request_class.FromString,
                response_serializer=response_class.SerializeToString)
        for name, reason in OUT_OF_SCOPE.items():
            handlers[name] = grpc.unary_unary_rpc_method_handler(
                self._serve(out_of_scope(reason)))
        return grpc.method_handlers_generic_handler(SERVICE, handlers)

    def _serve(self, method):
        """A grpcio handler (run on a gRPC thread): the call is made on the
        reactor, and this thread only waits for it."""
        controller, reactor = self.controller, self.reactor

        def handle(request, context):
            try:
                return threads.blockingCallFromThread(reactor, controller.call, method, request)
            except RpcError as e:
                context.abort(e.code, e.message)
        return handle

    def startService(self):
        super().startService()
        bind, host, _ = grpc_address(self.listener.endpoint, self.reactor)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKER_THREADS,
                                                        thread_name_prefix="pravega-grpc"),
                             handlers=[self._handlers()],
                             # a port in use must fail, not be shared
                             options=[("grpc.so_reuseport", 0)])
        try:
            port = server.add_insecure_port(bind)
        except RuntimeError as e:
            self.error = e
        else:
            server.start()
            self.server = server
            address_type = IPv6Address if ":" in host else IPv4Address
            self.address = address_type("TCP", host, port)
            log.info("{dialect} listening on {host}:{port} ({listener})",
                     dialect=self.listener.dialect, host=host, port=port,
                     listener=self.listener.path)
        self._notify()

    def stopService(self):
        super().stopService()
        server, self.server = self.server, None
        if server is None:
            return defer.succeed(None)
        stopped = server.stop(STOP_GRACE_SECONDS)
        return threads.deferToThreadPool(self.reactor, self.reactor.getThreadPool(),
                                         stopped.wait)
