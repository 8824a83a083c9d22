"""Test kits: plain helpers several test folders share (fixtures live in the nearest conftest.py)."""
