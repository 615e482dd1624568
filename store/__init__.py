"""Storage of problems, devices, kernels, search runs and trials (SQLAlchemy 2).

A SQLite file by default (``~/.local/share/gemmscape/gemmscape.db``, WAL); ``$GEMMSCAPE_DB`` or
an explicit URL selects another file or a PostgreSQL database.
"""

from store.api import Store
from store.db import ENV_VAR, DatabaseMissing, ReadOnlyError, StoreError, default_url

__all__ = ["ENV_VAR", "DatabaseMissing", "ReadOnlyError", "Store", "StoreError", "default_url"]
