"""Fleets: the capacity plan proved as a service (issue 39).

`policies` (the vLLM Router's routing policies, registered by name), `sim` (N simulated engines behind the
router in one virtual clock, with failures and an autoscaler), `load` (the offered load), `measure` (a run
scored fleet-wide and per replica), `verify` (`tune plan --verify`: N per policy and the failure
scenarios), `render` (text, Markdown, HTML and the timeline plot) and `export` (Helm values, a KEDA
ScaledObject, the router's command line).
"""
