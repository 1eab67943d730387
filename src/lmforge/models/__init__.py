"""Models lmforge ships: the tiny example model used by demos and tests."""
