"""`python -m tuner.cli.serve_sim --gpu NAME --model NAME [vllm serve flags]`: the HTTP simulator
(`tuner.cli.sim`) as a process of its own.

The sim-http engine (`tuner.engine.sim_http`) starts it this way, with the tuner's own interpreter, so no
console script needs to be on PATH. A module apart from `tuner.cli.sim` because the CLI package imports
that one when it registers `tune sim serve`, and `python -m` must not run a module already imported."""

from tuner.cli.sim import main

if __name__ == "__main__":
    raise SystemExit(main(prog="python -m tuner.cli.serve_sim"))
