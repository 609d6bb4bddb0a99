"""`tune bench`: one vllm-bench-serve-style load run against a running server (above replay and slo)."""
