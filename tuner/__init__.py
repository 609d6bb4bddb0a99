"""slo-tuner: tune `vllm serve` for goodput under a latency SLO."""

__version__ = "0.1.0"
