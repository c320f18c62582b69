"""Support shared by several test directories that is not a server (tests/servers/): helpers, and the
store harnesses (harnesses/) with their fixtures and marks, for tests/contract, tests/stores and tests/run."""
