"""Benchmarks: measurements of the production code, kept apart from it.

Each module is one benchmark named in :data:`benchmarks.registry.BENCHMARKS` (run with
``cascade bench NAME``) or a part of one (``benchmarks.load_generator``,
``benchmarks.compiled_fscd``). Production packages never import this package.
"""
