"""Operator processes that read the cluster without taking part in it: the Prometheus exporter."""
