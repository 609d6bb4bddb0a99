"""Make a tiny random-weight Qwen2 model with a local BPE tokenizer, so real `vllm serve` runs on CPU in CI.

Why this exists: the real-vLLM tests need a model, and CI can reach no model hub. A 2-layer, hidden-128
Qwen2 with random weights loads in well under a second and still exercises everything the tuner measures
(scheduling, KV blocks, prefix caching, preemption, metrics); its output text is noise, which no test reads.

The tokenizer is a byte-level BPE trained here on text made from a fixed list of common English words. The
replay client renders synthetic prompts from common words (" the", " time", " people", ...), so training on
the same words makes each of them one token, and a prompt of N words is about N tokens, as with a real model.
A ChatML template makes `/v1/chat/completions` work.

The weights are float16, not bfloat16, on purpose: for bfloat16 vLLM's CPU attention picks its AMX kernel
on CPUs that report AMX, and in VMs that report AMX without enabling its tile state (seen on this project's
CI machines) the first request kills the worker with SIGILL. float16 takes the portable AVX-512/vector path.

Run it with the vLLM venv's interpreter (it needs `transformers`, `tokenizers` and `torch`, which the main
venv does not have): `.venv-vllm/bin/python tuner/testing/tiny_model.py OUT_DIR`. Deterministic: same seed,
same files. No network (HF_HUB_OFFLINE is set before transformers is imported).
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Common English words; the replay client's synthetic prompts are drawn from words like these.
WORDS = """
the be to of and a in that have I it for not on with he as you do at this but his by from they we say her
she or an will my one all would there their what so up out if about who get which go me when make can like
time no just him know take people into year your good some could them see other than then now look only come
its over think also back after use two how our work first well way even new want because any these give day
most us is was are were been has had did said made went took came saw knew thought told found gave called
man woman child world life hand part place case week company system program question government number night
point home water room mother area money story fact month lot right study book eye job word business issue side
kind head house service friend father power hour game line end member law car city community name president
team minute idea kid body information school face others level office door health person art war history party
result change morning reason research girl guy moment air teacher force education foot boy age policy everything
process music market sense nation plan college interest death experience effect class control care field
development role effort rate heart drug show leader light voice wife police mind price report decision son view
relationship town road arm difference value building action model season society tax director position player
record paper space ground form event official matter center couple site project activity star table need court
American oil situation cost industry figure street image phone data picture practice piece land product doctor
wall patient worker news test movie north love support technology step baby computer type attention film tree
source organization hair window evidence population site truth bed church trip fire table
long great little own old big high different small large next early young important few public bad same able
last late hard major better economic strong possible whole free military true federal international full special
easy clear recent certain personal open red difficult available likely short single medical current wrong private
past foreign fine common poor natural significant similar hot dead central happy serious ready simple left physical
general environmental financial blue democratic dark various entire close legal religious cold final main green nice
huge popular traditional cultural
very often however too usually really early never always sometimes together likely simply generally instead
actually again rather almost especially ever quickly probably already below directly therefore else thus easily
eventually exactly certainly normally currently extremely finally constantly properly soon specifically
ahead daily highly immediately relatively slowly fairly primarily completely ultimately widely recently
between under against during without before through around among across behind since toward upon within along
following following down off above near
find tell ask seem feel try leave call keep let begin help talk turn start might must should show hear play run
move live believe hold bring happen write provide sit stand lose pay meet include continue set learn lead
understand watch follow stop create speak read allow add spend grow offer remember consider appear buy wait serve
die send expect build stay fall cut reach kill remain suggest raise pass sell require decide return explain hope
develop carry break receive agree
zero three four five six seven eight nine ten hundred thousand million
""".split()

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def vocabulary() -> list[str]:
    """WORDS plus the replay client's own prompt words (`tuner.workload.prompts.WORDS`) when importable.

    The union keeps every word the client renders a single token, even if its list grows later.
    """
    words = list(WORDS)
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from tuner.workload.prompts import WORDS as PROMPT_WORDS
        words += [w.strip() for w in PROMPT_WORDS]
    except Exception:  # numpy/pydantic missing in this interpreter: the built-in list is enough
        pass
    finally:
        sys.path.pop(0)
    return list(dict.fromkeys(words))


def corpus(seed: int = 0, sentences: int = 20000) -> list[str]:
    """Deterministic sentences of common words, with the punctuation and digits prompts contain."""
    rng = random.Random(seed)
    words = vocabulary()
    out = []
    for i in range(sentences):
        n = rng.randint(5, 20)
        sent = " ".join(rng.choice(words) for _ in range(n))
        out.append(f"{sent[0].upper()}{sent[1:]}{rng.choice(['.', '.', '?', '!', ','])} {i % 1000}")
    # Every word also appears alone with and without a leading space, so each gets whole-word merges.
    out += [" ".join(words)] * 50
    return out


def build_tokenizer(vocab_size: int = 4096):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token=None, bos_token=None, chat_template=CHAT_TEMPLATE,
                                   model_max_length=2048)


def build(out_dir: str | Path, *, seed: int = 0, max_position_embeddings: int = 2048) -> Path:
    """Write config, random safetensors weights and tokenizer files to `out_dir`; return it."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    vocab = (len(tokenizer) + 63) // 64 * 64
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True, bos_token_id=eos, eos_token_id=eos, torch_dtype="float16",
        use_sliding_window=False,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float16)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    GenerationConfig(eos_token_id=eos, bos_token_id=eos).save_pretrained(out)
    return out


def main(argv: list[str]) -> int:
    out = argv[1] if len(argv) > 1 else ".tiny-model"
    path = build(out)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    sample = " the time people"
    ids = tok(sample)["input_ids"]
    print(f"tiny model written to {path} (vocab {len(tok)}; {sample!r} -> {len(ids)} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
