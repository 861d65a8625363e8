"""Feast views of the CTR domain."""
