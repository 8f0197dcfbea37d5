"""What the operations tests share (this module holds no tests): the real
gateway in-process on port 0, a self-signed certificate made at test time,
TLS client endpoints, an HTTP client for /metrics and the status JSON, raw
connections that collect bytes, and a Kafka blocking client that can speak
TLS."""
import datetime
import ipaddress
import os
import shutil
import socket
import ssl
import tempfile
import warnings

import orjson
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import defer, reactor, task
from twisted.internet.endpoints import HostnameEndpoint, connectProtocol, wrapClientTLS
from twisted.internet.protocol import Protocol
from twisted.internet.ssl import Certificate, optionsForClientTLS
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import TestCase
from twisted.web.client import Agent, BrowserLikePolicyForHTTPS, readBody

from plugins.kafka.client import KafkaClient
from tests.support import gateway_config, start_gateway

DIALECTS = ("rustlog", "tank", "kafka", "figg", "pravega")
LOCAL = "tcp:0:interface=127.0.0.1"
MiB = 1024 * 1024


def make_certificate(directory):
    """A self-signed certificate for ``localhost`` and 127.0.0.1 (an EC key:
    quick to make); returns ``(key path, certificate path, certificate PEM)``."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    key_path = os.path.join(directory, "key.pem")
    cert_path = os.path.join(directory, "cert.pem")
    with open(key_path, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.TraditionalOpenSSL,
                                  serialization.NoEncryption()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    with open(cert_path, "wb") as f:
        f.write(pem)
    return key_path, cert_path, pem


def tls_endpoint(key_path, cert_path):
    return f"ssl:0:interface=127.0.0.1:privateKey={key_path}:certKey={cert_path}"


def client_endpoint(port, cert_pem=None):
    """An endpoint to a local listener; over TLS (verifying ``cert_pem`` for
    the name ``localhost``) when a certificate is given."""
    endpoint = HostnameEndpoint(reactor, "127.0.0.1", port, timeout=10)
    if cert_pem is None:
        return endpoint
    return wrapClientTLS(optionsForClientTLS(
        "localhost", trustRoot=Certificate.loadPEM(cert_pem)), endpoint)


def sleep(seconds):
    return task.deferLater(reactor, seconds, lambda: None)


@defer.inlineCallbacks
def eventually(check, timeout=15.0, step=0.02):
    """Wait until ``check()`` is true."""
    deadline = reactor.seconds() + timeout
    while not check():
        if reactor.seconds() > deadline:
            raise AssertionError("condition not met in time")
        yield sleep(step)


class RawConn(Protocol):
    """A connection that sends bytes as given and keeps what comes back."""

    def __init__(self):
        self.data = bytearray()
        self.closed = False
        self.lost = defer.Deferred()

    def connectionLost(self, reason):
        self.closed = True
        self.lost.callback(None)

    def dataReceived(self, data):
        self.data += data


@defer.inlineCallbacks
def raw_connect(testcase, port, cert_pem=None, proto=None):
    proto = proto or RawConn()
    yield connectProtocol(client_endpoint(port, cert_pem), proto)

    def close():
        if not proto.closed:
            proto.transport.abortConnection()
            return proto.lost
    testcase.addCleanup(close)
    return proto


class TLSKafkaClient(KafkaClient):
    """The blocking Kafka client over TLS, verifying ``cafile`` for ``localhost``."""

    def __init__(self, host, port, cafile, **kwargs):
        super().__init__(host, port, **kwargs)
        self.context = ssl.create_default_context(cafile=cafile)

    def _connect(self):
        if self._sock is None:
            sock = socket.create_connection((self.host, self.port), self.timeout)
            self._sock = self.context.wrap_socket(sock, server_hostname="localhost")
        return self._sock


class LogLines:
    """The gateway's log events while a test runs."""

    def __init__(self, testcase):
        self.events = []
        globalLogPublisher.addObserver(self.events.append)
        testcase.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def matching(self, **fields):
        return [e for e in self.events if all(e.get(k) == v for k, v in fields.items())]

    def failures(self):
        return [e for e in self.events if "log_failure" in e]


class HTTP:
    """GETs against the metrics endpoint (HTTPS trusting ``cert_pem``)."""

    def __init__(self, cert_pem=None):
        policy = BrowserLikePolicyForHTTPS(
            trustRoot=Certificate.loadPEM(cert_pem)) if cert_pem else BrowserLikePolicyForHTTPS()
        self.agent = Agent(reactor, contextFactory=policy)

    @defer.inlineCallbacks
    def get(self, url):
        response = yield self.agent.request(b"GET", url.encode())
        with warnings.catch_warnings():
            # Twisted's own HTTP client transport lacks abortConnection; not ours to fix.
            warnings.simplefilter("ignore", DeprecationWarning)
            reading = readBody(response)
        body = yield reading
        return response.code, response.headers, body


def parse_metrics(text):
    """``{(name, ((label, value), ...)): value}`` of an exposition."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def sample(samples, name, **labels):
    """One sample's value (0 if absent)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0)


class OpsTest(TestCase):
    """Starts the gateway in-process with the listeners a test names."""

    timeout = 60

    def tempdir(self):
        # not self.mktemp(): under pytest that would write into the working tree
        path = tempfile.mkdtemp(prefix="gateway-ops-")
        self.addCleanup(shutil.rmtree, path, True)
        return path

    @defer.inlineCallbacks
    def start(self, listeners, directory=None, **sections):
        self.directory = directory or self.tempdir()
        self.config = gateway_config(self.directory, listeners, **sections)
        self.service, _ = yield start_gateway(self, self.config)
        self.ports = [s.address.port for s in self.service.listeners]
        if self.service.status is not None:
            address = yield self.service.status.whenListening()
            self.metrics_port = address.port
        return self.service

    def listener(self, index):
        """The service of ``listeners[index]``."""
        return self.service.listeners[index]

    def connections(self, index):
        return list(self.listener(index).factory.connections)

    @defer.inlineCallbacks
    def scrape(self, http=None, scheme="http"):
        code, _, body = yield (http or HTTP()).get(
            f"{scheme}://127.0.0.1:{self.metrics_port}/metrics")
        self.assertEqual(code, 200)
        return parse_metrics(body.decode())

    @defer.inlineCallbacks
    def status(self, http=None, scheme="http"):
        code, _, body = yield (http or HTTP()).get(
            f"{scheme}://127.0.0.1:{self.metrics_port}/api/status")
        self.assertEqual(code, 200)
        return orjson.loads(body)
