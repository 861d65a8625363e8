"""The Feast feature repo: definitions only (``feast apply`` imports every module here but the
``__init__`` files). Code imports them as ``features.<domain>.<module>``."""
