"""Fakes for boundaries the tests cannot reach (named as such): see each package's docstring."""
