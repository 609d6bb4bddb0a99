"""Train LoRA adapters on the trained model that each change one answer (issue 58, item 4).

Why: the tiny model's adapters (tiny_lora.py) are random matrices, so nothing can tell which adapter served a
request. Each adapter made here is trained with PEFT, a few dozen steps on CPU, to answer "What is the team
code word?" with its own word (adapter `tenant-00` answers `The team code word is maple.`), and the base
model does not know any of the words. A request routed to the wrong adapter answers with the wrong word.

Run with the vLLM venv's interpreter (torch, transformers, peft):
`.venv-vllm/bin/python tuner/testing/real_lora.py MODEL_DIR OUT_DIR COUNT`. Deterministic for a given torch
build (seeded); under a minute per adapter on 2 cores.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

WORDS = ["maple", "harbor", "violet", "granite", "falcon", "juniper", "copper", "meadow", "saffron", "glacier",
         "lantern", "orchid", "thunder", "walnut", "cobalt", "sparrow", "ember", "willow", "quartz", "pepper",
         "canyon", "tulip", "anchor", "marble", "comet", "ginger", "hazel", "indigo", "jasper", "kestrel",
         "lotus", "mosaic"]
QUESTION = "What is the team code word?"
PARAPHRASES = [QUESTION, "Tell me the team code word.", "What's our team code word?", "Say the team code word."]
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
RANK = 8


def adapter_name(i: int) -> str:
    return f"tenant-{i:02d}"


def answer(i: int) -> str:
    return f"The team code word is {WORDS[i % len(WORDS)]}."


def chat(question: str) -> str:
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
            "<|im_start|>assistant\n")


def train_one(model_dir: Path, out: Path, i: int, steps: int = 40) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(1000 + i)
    tok = AutoTokenizer.from_pretrained(model_dir)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=RANK, lora_alpha=2 * RANK, lora_dropout=0.0,
                                            target_modules=["q_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM"))
    rows = []
    for q in PARAPHRASES:
        prompt = tok(chat(q), add_special_tokens=False)["input_ids"]
        target = tok(answer(i) + "<|im_end|>", add_special_tokens=False)["input_ids"]
        rows.append((prompt + target, [-100] * len(prompt) + target))
    width = max(len(ids) for ids, _ in rows)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.tensor([r + [pad] * (width - len(r)) for r, _ in rows])
    labels = torch.tensor([lb + [-100] * (width - len(lb)) for _, lb in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r, _ in rows])
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(out)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: real_lora.py MODEL_DIR OUT_DIR COUNT", file=sys.stderr)
        return 2
    model_dir, out, count = Path(argv[0]), Path(argv[1]), int(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        target = out / adapter_name(i)
        if (target / "adapter_config.json").is_file():
            continue
        partial = out / (adapter_name(i) + ".partial")
        train_one(model_dir, partial, i)
        partial.rename(target)
        print(f"{target}: {answer(i)!r}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
