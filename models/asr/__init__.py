"""ASR: ConvDFSMN acoustic model with CTC, trained on the speech corpus (jobs.audio_corpus)."""
