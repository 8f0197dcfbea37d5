"""Where the gateway's log events go: text lines for people, JSON for machines.

Every event is logged through ``twisted.logger`` with its facts as fields
(``dialect``, ``listener``, ``peer``, ``topic``, ...), so the text format
reads as a sentence and the JSON format keeps each fact as a key a log
shipper can index. JSON events are written one per line (no RFC 7464
record separator), which is what line-oriented shippers expect;
``twisted.logger.eventsFromJSONLogFile`` reads them back.
"""
import sys

from twisted.logger import jsonFileLogObserver, textFileLogObserver

FORMATS = ("text", "json")


def observer(log_format, stream):
    """A log observer writing ``log_format`` (one of FORMATS) to ``stream``."""
    if log_format == "json":
        return jsonFileLogObserver(stream, recordSeparator="")
    return textFileLogObserver(stream)


def json_observer():
    """JSON lines on standard output, for ``twistd --logger gateway.logs.json_observer``."""
    return observer("json", sys.stdout)
