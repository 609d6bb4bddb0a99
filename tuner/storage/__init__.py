"""The storage contract: the records a study stores, and reading a run directory's study back."""
