"""The speech domain: audio features shared by the corpus jobs, the ASR model and its server."""
