"""A listener: one Twisted endpoint serving one dialect's protocol factory."""
from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.endpoints import serverFromString
from twisted.logger import Logger

log = Logger()


class ReportsAddress:
    """``whenListening()`` for a service that binds asynchronously: it fires
    with the bound address (a port-0 listener learns its real port here) or
    fails with the reason it could not bind. The service sets ``address`` or
    ``error`` and calls ``_notify()``."""

    address = None
    error = None

    def _notify(self):
        waiting, self._waiting = getattr(self, "_waiting", []), []
        for d in waiting:
            self._answer(d)

    def _answer(self, d):
        if self.error is not None:
            d.errback(self.error)
        else:
            d.callback(self.address)

    def whenListening(self):
        d = defer.Deferred()
        if self.address is not None or self.error is not None:
            self._answer(d)
        else:
            self.__dict__.setdefault("_waiting", []).append(d)
        return d


class ListenerService(ReportsAddress, Service):
    """Listens on ``listener.endpoint`` with ``factory``.

    ``whenListening()`` fires with the bound address once listening (a port
    0 listener learns its real port here), or fails if the endpoint could not
    be bound. Stopping closes the port and then every open connection
    (``stop_accepting`` closes only the port).
    """

    def __init__(self, listener, factory, reactor=None):
        if reactor is None:
            from twisted.internet import reactor
        self.listener = listener
        self.factory = factory
        self.reactor = reactor
        self.port = None
        self.setName(f"{listener.dialect}@{listener.path}")

    def startService(self):
        super().startService()
        endpoint = serverFromString(self.reactor, self.listener.endpoint)
        d = endpoint.listen(self.factory)
        d.addCallbacks(self._listening, self._failed)

    def _listening(self, port):
        self.port = port
        self.address = port.getHost()
        log.info("{dialect} listening on {host}:{port} ({listener})",
                 dialect=self.listener.dialect, host=self.address.host,
                 port=self.address.port, listener=self.listener.path)
        self._notify()

    def _failed(self, failure):
        self.error = failure
        self._notify()

    def stop_accepting(self):
        """Close the port (connections already open stay); the first step
        of stopping, so that no client connects while the others finish."""
        port, self.port = self.port, None
        return defer.maybeDeferred(port.stopListening) if port is not None else defer.succeed(None)

    def stopService(self):
        super().stopService()
        d = self.stop_accepting()
        d.addCallback(lambda _: self.factory.close_connections())
        return d
