"""PySpark jobs: each ``main()`` is session + config -> extract -> transform -> load.

GX suites live next to the job they guard (``<job>_gate.py``).
"""
