"""Compiler passes, the pass pipeline, the ``cascade`` torch.compile backend and AOT packaging.

``compilers.export`` exports a module with dynamic dims, runs ``compilers.pipeline`` over the
graph and packages it with AOTInductor; ``compilers.preranking`` and ``compilers.asr`` are the
models' request modules and compile functions over it; ``compilers.backend`` is the in-process
``torch.compile(backend="cascade")`` path over the same passes.
"""
