# Two commands set everything up on a fresh machine:
#   make run    create .venv, install the gateway, start it with config.yaml
#   make test   install the test extra and run the whole suite
PYTHON ?= python3
VENV   := .venv
PIP    := $(VENV)/bin/pip
CONFIG ?= config.yaml

.PHONY: run test install install-test bench proto clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# Editable in "compat" mode: a .pth file puts this folder on sys.path, so
# Twisted's plugin loader finds twisted/plugins/gateway_plugin.py in place.
install: $(VENV)/bin/python
	$(PIP) install --quiet --config-settings editable_mode=compat -e .

install-test: $(VENV)/bin/python
	$(PIP) install --quiet --config-settings editable_mode=compat -e '.[test]'

run: install
	$(VENV)/bin/gateway run -c $(CONFIG)

test: install-test
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

bench: install-test
	$(VENV)/bin/python -m bench

# Regenerate the Pravega controller's protobuf module (committed) from its .proto.
proto: install
	$(PIP) install --quiet grpcio-tools
	$(VENV)/bin/python -m plugins.pravega_controller.generate

clean:
	rm -rf $(VENV) build *.egg-info data
