"""Thin Celery adapters: each task parses, calls domain code, and persists."""
