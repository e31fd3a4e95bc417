"""Shared fixtures come from the user-facing plugin, so oncelog's tests use what users get:
memory://, local-disk and S3 (moto server on 127.0.0.1) stores; see oncelog.testing.fixtures."""

pytest_plugins = ["oncelog.testing.fixtures"]
