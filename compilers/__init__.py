"""Compiler passes, the pass pipeline, the ``cascade`` torch.compile backend and AOT packaging.

``compilers.export`` exports a model with dynamic dims, runs ``compilers.pipeline`` over the
graph and packages it with AOTInductor; ``compilers.backend`` is the in-process
``torch.compile(backend="cascade")`` path over the same passes.
"""
