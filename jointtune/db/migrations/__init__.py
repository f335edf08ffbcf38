"""Alembic migrations of the tuning store, shipped inside the package so a wheel upgrades its own database."""
