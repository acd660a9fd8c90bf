"""The store: what the readers yield, kept for the analyses and the reports.

``core`` is the engine (a folder of Parquet parts and a manifest, idempotent
transactions, readers beside writers in other processes); ``queries`` holds the
named read questions the reports ask, so that no SQL lives outside this package.
"""

from hpcwatch.store.core import (
    DEFAULT_BATCH_SIZE,
    NOTICE_STATES,
    SAMPLE_SCHEMA,
    TABLES,
    IngestCounts,
    NoticeRow,
    SourceMark,
    Store,
    StoreConfig,
    Transaction,
    sample_keys,
)

__all__ = [
    "Store",
    "StoreConfig",
    "IngestCounts",
    "SourceMark",
    "Transaction",
    "NoticeRow",
    "NOTICE_STATES",
    "TABLES",
    "DEFAULT_BATCH_SIZE",
    "sample_keys",
    "SAMPLE_SCHEMA",
]
