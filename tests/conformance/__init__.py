"""One behaviour suite over every queue: each test runs once per front (conftest.py)."""
