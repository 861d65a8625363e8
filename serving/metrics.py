"""The servers' own Prometheus metrics, beside KServe's (all on the server's ``GET /metrics``).

Counters are per process, as KServe's histograms are: with several workers each exposes its
own, and the scraper sums them.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

INFERENCE_ERRORS = Counter(
    "cascade_inference_errors",
    "Inference requests that failed, by cause: 'model' (counts toward the automatic rollback) "
    "or 'feature_store_timeout' (the online store was locked or timed out; never rolls back)",
    ["model_name", "kind"],
)
FEATURE_OVERRIDES = Counter(
    "cascade_feature_overrides",
    "Requests that sent a user field's value other than the online store's: scored with the "
    "request's value, logged in the feedback with the store's (a client cannot steer the monitor)",
    ["model_name"],
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
ONLINE_READ_SECONDS = Histogram(
    "cascade_online_feature_read_seconds",
    "Seconds of one batched online-store read of a served version's fields, per feature view "
    "(one read per view per request)",
    ["model_name", "view"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
