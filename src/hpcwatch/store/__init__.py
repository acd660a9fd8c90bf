"""The store: what the readers yield, kept for the analyses and the reports.

``core`` is the engine (tables of the five records, transactions, readers
beside a writer); ``queries`` holds the named read questions the reports ask,
so that no SQL lives outside this package.
"""

from hpcwatch.store.core import (DEFAULT_BATCH_SIZE, SAMPLE_SCHEMA, IngestCounts, Store, StoreConfig,
                                 sample_keys)

__all__ = ["Store", "StoreConfig", "IngestCounts", "DEFAULT_BATCH_SIZE", "sample_keys", "SAMPLE_SCHEMA"]
