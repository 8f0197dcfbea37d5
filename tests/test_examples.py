"""Every example in examples/ runs against a gateway with the listeners of
the shipped config.yaml (on port 0 here) and prints what its docstring
promises. Each runs as a user would run it: ``python examples/NAME.py``.
"""
import json
import os
import subprocess
import sys

import pytest

from tests.support import GatewayProcess

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "examples")
CONFIG = "storage: {path: ./data}\nlisteners:\n" + "".join(
    f'  - {{dialect: {d}, endpoint: "tcp:0:interface=127.0.0.1"}}\n'
    for d in ("tank", "kafka", "figg", "pravega", "rustlog"))


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    process = GatewayProcess(str(tmp_path_factory.mktemp("examples")), CONFIG)
    ports = process.start()
    yield {d: f"127.0.0.1:{p}" for d, p in ports.items()}
    process.stop()


def run(name, *args):
    result = subprocess.run([sys.executable, os.path.join(EXAMPLES, name), *args],
                            capture_output=True, text=True, timeout=120, check=False)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    return result.stdout.splitlines()


def test_rustlog_example(gateway):
    assert run("rustlog_example.py", "--address", gateway["rustlog"]) == [
        "produced at offsets [0, 1, 2]", "offset 0: hello", "offset 1: bonjour",
        "offset 2: hallo", "group rustlog-example committed 3, the next offset to read"]


def test_tank_example(gateway):
    lines = run("tank_example.py", "--address", gateway["tank"])
    assert lines[0] == "hwMark 2 (first available seq 1)"
    assert lines[1].startswith("seq 1: kitchen = 21.5 (ts ")
    assert lines[2].startswith("seq 2: hall = 22.0 (ts ")
    assert lines[3] == "woken by seq 3: cellar = 19.0"


def test_figg_example(gateway):
    assert run("figg_example.py", "--address", gateway["figg"]) == [
        "subscribed to chat from the latest message (next offset 0)",
        "offset 1: hi", "offset 2: how are you?", "offset 3: bye",
        "resume later with subscribe('chat', ..., offset=3)"]


def test_pravega_example(gateway):
    assert run("pravega_example.py", "--address", gateway["pravega"]) == [
        "appended 3 events at bytes 0..72", "position 0: order 1: 2 apples",
        "position 25: order 2: 1 pear", "position 48: order 3: 5 plums"]


def test_kafka_example(gateway):
    lines = run("kafka_example.py", "--bootstrap", gateway["kafka"])
    assert lines[0] == "produced at offsets [0, 1, 2]"
    assert [line.split()[:3] for line in lines[1:4]] == [
        ["offset", f"{i}:", f"user-{i}"] for i in range(3)]
    assert lines[4] == "group kafka-example committed 3"


def test_bridge_twice(gateway):
    """Run twice: the second run continues the same topic and group."""
    args = ["--figg", gateway["figg"], "--tank", gateway["tank"], "--kafka", gateway["kafka"],
            "--pravega", gateway["pravega"]]
    position = 0
    for run_number in range(2):
        lines = run("bridge.py", *args)
        end = 6 * (run_number + 1)
        assert lines[0] == f"figg and tank wrote 6 readings; tank hwMark {end}"
        assert lines[1] == ('kafka group bridge-totals: {"attic": 1, "boiler": 9, '
                            f'"garage": 15}}; committed offset {end}')
        for i, line in enumerate(lines[2:]):
            offset = end - 6 + i
            head, value = line.split(": ", 1)
            assert head == (f"offset {offset} = tank seq {offset + 1} = figg offset "
                            f"{offset + 1} = pravega position {position}")
            position += 8 + len(value.encode())
        assert [json.loads(line.split(": ", 1)[1]).get("sensor") for line in lines[2:]] == [
            "boiler", "attic", "boiler", None, None, None]
