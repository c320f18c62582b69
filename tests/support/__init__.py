"""Support shared by several test directories that is neither a fixture nor a server (tests/servers/)."""
