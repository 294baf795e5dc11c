"""The ``unstuck`` command line."""
