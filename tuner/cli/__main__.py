"""`python -m tuner.cli ...`: the `tune` command without its console script (the tests and benchmarks run it
this way, with the interpreter they run under)."""

from tuner.cli import main

if __name__ == "__main__":
    main()
