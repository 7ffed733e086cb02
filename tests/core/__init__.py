"""The pure state machine and the storage and policies under it (no front, no redis-py)."""
