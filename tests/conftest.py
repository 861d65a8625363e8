"""Suite-wide settings: every test gets its own state folder unless it asks for the stack's."""

from __future__ import annotations

import os

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
