"""The self-calibrating twin: the simulator fitted to this engine's own launches.

Every real launch a study makes measures a knee curve (load runs at several rates, each with its latency
percentiles and vLLM's metrics). `tuner.twin.fit` finds the cost-model parameters under which the
simulator, replaying the same load runs, measures the same; `tuner.twin.predict` then runs the knee search
in virtual time for every configuration of the search space, so real launches are spent only on
verifying the twin's best (`tuner.search.twin`).

Data flow: storage records (what was measured) -> observations -> fitted parameters -> predictions. The
twin reads records and runs the simulator; it knows nothing of the strategy that calls it.
"""
