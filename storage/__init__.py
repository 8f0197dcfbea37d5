"""The durable log store. Knows nothing of dialects, the bus or the config file."""
from storage.errors import *  # noqa: F401,F403
from storage.interfaces import ILogStore  # noqa: F401
from storage.partition import NO_EVENT_NUMBER  # noqa: F401
from storage.store import (  # noqa: F401
    Appended, LogStore, PartitionState, StoreSettings, TopicInfo, valid_topic_name)
