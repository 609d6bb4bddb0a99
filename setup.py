"""The package list, which pyproject.toml cannot write with a mapped folder: every `tuner*` package plus
`tuner.search_spaces`, the top-level `search_spaces/` folder (pyproject.toml maps it), so `pip install .`
ships the search spaces inside the wheel. Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(packages=find_packages(include=["tuner", "tuner.*"]) + ["tuner.search_spaces"])
