"""Feast objects shared by every domain's views."""
