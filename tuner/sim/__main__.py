"""`python -m tuner.sim --gpu NAME --model NAME [vllm serve flags]`: the HTTP simulator (`tuner.cli.sim`).

The subprocess engine (`tuner.engine.sim_http`) starts it this way, with the tuner's own interpreter, so
no console script needs to be on PATH."""

import sys

from tuner.cli.sim import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m tuner.sim"))
