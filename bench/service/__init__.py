"""The config service under load: lookups, floods, export pages against lookups (bench/README.md)."""
