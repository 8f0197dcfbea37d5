"""Finding the dialects: every ``IDialect`` plugin in the ``plugins`` package."""
from twisted.plugin import getPlugins

import plugins
from gateway.interfaces import IDialect


def find_dialects():
    """``{name: dialect}`` for every dialect subpackage of ``plugins``."""
    return {dialect.name: dialect for dialect in getPlugins(IDialect, plugins)}
