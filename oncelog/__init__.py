"""oncelog: exactly-once journals for Python in the style of Gazette."""

from oncelog.message import (
    Clock,
    CSVRecord,
    Envelope,
    Flags,
    JSONMessage,
    build_uuid,
    get_clock,
    get_flags,
    get_producer_id,
    new_producer_id,
)

__version__ = "0.1.0"
