"""One module per schema revision; Alembic loads them by file, not by import."""
