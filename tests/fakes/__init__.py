"""In-memory stand-ins used by the tests only (never shipped in the wheel)."""
