"""Schema only; state changes go through store.py."""
