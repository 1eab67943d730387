"""FAKE modelopt.torch (tests only)."""
