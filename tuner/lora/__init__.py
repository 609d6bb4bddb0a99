"""LoRA adapters: the catalog a workload's requests name (`catalog`) and how traffic spreads over it
(`popularity`). The knobs that serve them are in `tuner.knobs`; the simulator's costs in `tuner.sim.lora`."""
