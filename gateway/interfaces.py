"""The gateway's zope.interface Interfaces (``ILogStore`` is the store's own)."""
from zope.interface import Attribute, Interface

from storage.interfaces import ILogStore  # noqa: F401  (re-exported)


class IDialect(Interface):
    """One wire protocol. Found with ``getPlugins(IDialect, plugins)``: adding a
    dialect means adding a subpackage of ``plugins`` whose ``__init__`` holds
    one object providing this and ``IPlugin``."""

    name = Attribute("the value of ``dialect:`` in config.yaml, e.g. 'rustlog'")
    formats = Attribute(
        "{format id: decoder} for the batch formats this dialect stores as its "
        "producers sent them; registered with the bus whether or not a listener "
        "of this dialect is configured, since the data outlives the config")

    def validate(options):
        """Check this dialect's own listener keys (all but ``dialect`` and
        ``endpoint``); return the normalised options. Raises
        ``gateway.config.ConfigError`` naming the offending key."""

    # A dialect may also define ``check_listeners(listener, listeners)``: called
    # once every listener is validated, with this dialect's ListenerConfig and
    # all of them, for checks across listeners; it raises ConfigError relative
    # to its listener (the loader adds ``listeners[i].``).

    def makeService(bus, listener):
        """Return the ``IService`` serving one listener. ``bus`` is the
        listener's view of the command bus; ``listener`` its ListenerConfig."""


class ISubscriber(Interface):
    """The receiving end of a push subscription (``Subscribe``)."""

    def deliver(subscription, batches, offset):
        """New stored batches; records before ``offset`` in the first one were
        already delivered (or precede the subscription's start)."""

    def failed(subscription, error):
        """The subscription ended with an error (topic deleted, store closed)."""
