"""How far the simulator's token estimate is from a model's real tokenizer, on the prompts the tuner sends.

Two kinds of prompt (issue 13, item 3):
- the project's synthetic chat prompts: `tune workload synth --kind chat` requests rendered by the replay
  client (`tuner.workload.prompts`), sent as completions text and as chat messages (ChatML-rendered, as the
  HTTP simulator and a ChatML model's template render them);
- vLLM `bench serve --dataset-name random` prompts: consecutive runs of the vocabulary's token ids from a
  random offset, decoded to text and re-encoded until they are N tokens (vLLM's
  `gen_prompt_decode_to_target_len`), so the real count is N by construction.

For each it prints the mean real count (the model's tokenizer.json, `tokenizers` library), the mean
estimate (`tuner.tokens.count_tokens`) and their ratio. Run:
`python benchmarks/token_counts.py --model $TUNER_TINY_MODEL` (after `. .ci/env`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

from tuner.sim.protocol import render_chat
from tuner.tokens import count_tokens, tokenizer_file
from tuner.workload.prompts import render_messages, render_prompt
from tuner.workload.synth import synthesize


def bench_random_prompt(tok, n: int, rng: np.random.Generator, max_retry: int = 10) -> str:
    """A vLLM-bench random prompt of `n` tokens (the shape of vLLM 0.32's `RandomDataset`)."""
    special = set(tok.get_added_tokens_decoder())  # vLLM samples ids outside the special tokens
    allowed = np.array([i for i in range(tok.get_vocab_size()) if i not in special])
    start = int(rng.integers(0, len(allowed)))
    ids = allowed[(start + np.arange(n)) % len(allowed)].tolist()
    for _ in range(max_retry):
        text = tok.decode(ids)
        ids = tok.encode(text, add_special_tokens=False).ids
        if len(ids) == n:
            break
        if len(ids) < n:
            ids += rng.integers(0, tok.get_vocab_size(), n - len(ids)).tolist()
        else:
            ids = ids[:n]
    return tok.decode(ids)


def row(label: str, real: list[int], est: list[int]) -> str:
    r, e = statistics.fmean(real), statistics.fmean(est)
    return f"{label:<44} {r:>9.1f} {e:>10.1f} {e / r:>7.2f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.environ.get("TUNER_TINY_MODEL"),
                    help="a local model folder with tokenizer.json (default: $TUNER_TINY_MODEL)")
    ap.add_argument("--prompts", type=int, default=50, help="prompts per row")
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 2048])
    args = ap.parse_args(argv)
    path = tokenizer_file(args.model)
    if path is None:
        print(f"no tokenizer.json for --model {args.model!r}", file=sys.stderr)
        return 2
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    print(f"tokenizer: {path} (vocab {tok.get_vocab_size()})")
    print(f"{'prompt':<44} {'real mean':>9} {'estimate':>10} {'est/real':>7}")
    w = synthesize("chat", args.prompts, seed=0)
    reqs = w.requests
    texts = [render_prompt(r, i) for i, r in enumerate(reqs)]
    chats = [render_chat(render_messages(r, i)) for i, r in enumerate(reqs)]
    print(row(f"synthetic chat, completions text (mean {statistics.fmean(r.prompt_tokens for r in reqs):.0f})",
              [len(tok.encode(t).ids) for t in texts], [count_tokens(t) for t in texts]))
    print(row("synthetic chat, ChatML chat messages", [len(tok.encode(t, add_special_tokens=False).ids)
                                                      for t in chats], [count_tokens(t) for t in chats]))
    rng = np.random.default_rng(0)
    for n in args.lengths:
        prompts = [bench_random_prompt(tok, n, rng) for _ in range(args.prompts)]
        print(row(f"vLLM bench random, input_len {n}", [len(tok.encode(p, add_special_tokens=False).ids)
                                                       for p in prompts], [count_tokens(p) for p in prompts]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
