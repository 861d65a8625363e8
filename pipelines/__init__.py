"""The pipelines: one module per pipeline, each its step functions and one ``PIPELINE`` spec.

This layer calls jobs, models, compilers and serving; nothing below imports it. The kernel finds
the modules through the ``cascade.pipelines`` entry point (``pyproject.toml``), which names this
package: a new ``pipelines/<name>.py`` with a ``PIPELINE`` is a new DAG, new DVC stages and new
CLI choices, with no other edit.
"""
