"""The servers' own Prometheus metrics, beside KServe's (all on the server's ``GET /metrics``).

Counters are per process, as KServe's histograms are: with several workers each exposes its
own, and the scraper sums them.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

INFERENCE_ERRORS = Counter(
    "cascade_inference_errors",
    "Inference requests that failed, by cause: 'model' (counts toward the automatic rollback) "
    "or 'feature_store_timeout' (the online store was locked or timed out; never rolls back)",
    ["model_name", "kind"],
)
FEEDBACK_WRITE_ERRORS = Counter(
    "cascade_feedback_write_errors",
    "Feedback writes that failed (their rows are kept for a retry)",
)
FEEDBACK_DROPPED_ROWS = Counter(
    "cascade_feedback_dropped_rows",
    "Feedback rows that will never be written: the buffer or the retry buffer was full, or a "
    "row failed every write attempt",
    ["reason"],
)
FEEDBACK_RETRY_ROWS = Gauge(
    "cascade_feedback_retry_rows",
    "Feedback rows of failed writes waiting for the next write",
)
TORCH_THREADS = Gauge(
    "cascade_serving_torch_threads",
    "Intra-op threads torch uses in this server process (torch.get_num_threads())",
    ["pid"],
)
