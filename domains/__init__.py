"""Domain code shared by the jobs, models and servers of one domain, one package per domain.

It sits under ``jobs/``, ``models/``, ``serving/`` and ``features/`` and above the kernel
(``cascade/``), which holds only the platform: ``ctr`` (the CTR column contract, the item
catalogue, the Feast store and its online layouts and readers), ``speech`` (audio features)
and ``captions`` (the caption tokenizer).
"""
