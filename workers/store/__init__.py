"""The store layer: the only code that talks to Redis."""
