"""Support shared by several test directories that is not a server (tests/servers/): helpers, and the
store-harness fixtures and marks of tests/contract, tests/stores and tests/run."""
