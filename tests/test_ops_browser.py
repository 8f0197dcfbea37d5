"""The status page in a real headless Chromium (Debian's ``chromium`` and
``chromium-driver``, installed by ``.ci/run``): it loads from the metrics
endpoint of a ``gateway run`` subprocess, fetches nothing from anywhere
else, and its numbers and charts move while producers of four dialects
run. A screenshot is kept in ``test-artifacts/status-page.png``."""
import os
import shutil
import socket
import struct
import tempfile
import threading
import time

import orjson
import pytest

from plugins.figg import codec as fc
from plugins.kafka.client import KafkaClient
from plugins.tank import codec as tc
from tests.support import GatewayProcess

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "test-artifacts")
LOCAL = "tcp:0:interface=127.0.0.1"

CONFIG = f"""\
storage: {{path: ./data, fsync: interval}}
listeners:
  - {{dialect: rustlog, endpoint: "{LOCAL}"}}
  - {{dialect: kafka,   endpoint: "{LOCAL}"}}
  - {{dialect: tank,    endpoint: "{LOCAL}", access: {{topics: ["orders.*", "audit"]}}}}
  - {{dialect: figg,    endpoint: "{LOCAL}", limits: {{max_connections: 100}}}}
  - {{dialect: pravega, endpoint: "{LOCAL}", access: {{mode: read-only}}}}
metrics: {{endpoint: "{LOCAL}"}}
"""


def recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


class Producers:
    """Producer threads, one per dialect, each writing small batches until stopped."""

    def __init__(self, ports):
        self.ports = ports
        self.stopping = threading.Event()
        self.errors = []
        self.threads = [threading.Thread(target=self._run, args=(f,), daemon=True)
                        for f in (self.rustlog, self.kafka, self.tank, self.figg)]

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        for t in self.threads:
            t.join(10)
        assert self.errors == []

    def _run(self, produce):
        try:
            produce()
        except Exception as e:         # reported by __exit__
            self.errors.append(repr(e))

    def pace(self):
        time.sleep(0.01)
        return not self.stopping.is_set()

    def rustlog(self):
        with socket.create_connection(("127.0.0.1", self.ports["rustlog"])) as sock:
            records = [list(b"click %d" % i) for i in range(50)]
            while self.pace():
                payload = orjson.dumps({"Produce": {"topic": "clicks", "partition": 0,
                                                    "records": records}})
                sock.sendall(struct.pack(">I", len(payload)) + payload)
                recv_exact(sock, struct.unpack(">I", recv_exact(sock, 4))[0])

    def kafka(self):
        with KafkaClient("127.0.0.1", self.ports["kafka"]) as kafka:
            n = 0
            while self.pace():
                kafka.produce("orders.eu", 0, [(b"k", b"order %d" % (n + i)) for i in range(20)])
                n += 20
                if n % 400 == 0:
                    # a consumer group that keeps up with half: its lag grows
                    kafka.commit("billing", "orders.eu", 0, n // 2)

    def tank(self):
        with socket.create_connection(("127.0.0.1", self.ports["tank"])) as sock:
            recv_exact(sock, 5)                      # the Ping
            req = 0
            while self.pace():
                req += 1
                sock.sendall(tc.encode_request(tc.ProduceRequest(req, (tc.ProduceTopic(
                    "audit", (tc.ProducePartition(0, tc.encode_bundle(
                        [b"audit line %d" % i for i in range(30)])),)),), required_acks=1)))
                _, size = struct.unpack("<BI", recv_exact(sock, 5))
                recv_exact(sock, size)

    def figg(self):
        with socket.create_connection(("127.0.0.1", self.ports["figg"])) as sock:
            seq = 0
            while self.pace():
                sock.sendall(b"".join(fc.encode(fc.Publish(b"metrics.cpu", seq + i, b"%d" % i))
                                      for i in range(10)))
                seq += 10
                acked = 0
                while acked < 10:
                    _, _, size = fc.HEADER.unpack(recv_exact(sock, fc.HEADER.size))
                    recv_exact(sock, size)
                    acked += 1


def number(text):
    """A figure as the page prints it (``1,234``, ``12.5k``, ``1.20M``)."""
    text = text.replace(",", "").strip()
    scale = {"k": 1e3, "M": 1e6, "G": 1e9}.get(text[-1:], 1)
    return float(text.rstrip("kMG")) * scale if text not in ("", "–") else 0.0


@pytest.fixture
def browser():
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("needs Debian's chromium and chromium-driver (installed by .ci/run)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    profile = tempfile.mkdtemp(prefix="gateway-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 f"--user-data-dir={profile}", "--window-size=1500,1400"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def test_status_page_moves_while_producers_run(browser, tmp_path):
    gateway = GatewayProcess(str(tmp_path), CONFIG)
    ports = gateway.start()
    try:
        doc = gateway_ports(gateway)
        url = f"http://127.0.0.1:{doc['metrics']['port']}/"
        with Producers(ports):
            browser.get(url)
            wait(lambda: browser.find_element("id", "live-text").text == "live")
            wait(lambda: number(browser.find_element("id", "kpi-records").text) > 0)
            seen = set()
            deadline = time.time() + 20
            while len(seen) < 3 and time.time() < deadline:
                seen.add(browser.find_element("id", "kpi-records").text)
                time.sleep(0.5)
            assert len(seen) >= 3, seen                       # the figure keeps moving
            wait(lambda: {row.get_attribute("data-topic") for row in
                          browser.find_elements("css selector", "#topics tbody tr")} >=
                 {"clicks", "orders.eu", "audit", "metrics.cpu"})
            wait(lambda: browser.find_elements("css selector", '#groups tr[data-group="billing"]'))
            # every dialect that produces shows its own line in the legend with a rate
            legend = browser.find_element("id", "legend-records").text
            for dialect in ("rustlog", "kafka", "tank", "figg"):
                assert dialect in legend
            time.sleep(6)                                     # some history in the charts
            os.makedirs(ARTIFACTS, exist_ok=True)
            browser.save_screenshot(os.path.join(ARTIFACTS, "status-page.png"))
        rows = browser.find_elements("css selector", "#listeners tbody tr")
        assert len(rows) == 5
        assert "read-only" in rows[4].text and "orders.*" in rows[2].text
        # nothing came from anywhere but the gateway, and the page had no errors
        origin = url.rstrip("/")
        resources = browser.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)")
        assert resources and all(name.startswith(origin) for name in resources), resources
        errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
        assert errors == []
    finally:
        assert gateway.stop() == 0


def gateway_ports(gateway):
    import json
    with open(gateway.ports_file) as f:
        return json.load(f)


def wait(condition, timeout=30.0):
    deadline = time.time() + timeout
    while True:
        try:
            if condition():
                return
        except Exception:          # an element the next poll has not drawn yet
            if time.time() > deadline:
                raise
        if time.time() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.2)
