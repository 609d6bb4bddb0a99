"""Roofline cost of one engine step.

One vLLM step runs every scheduled token (decode tokens and prefill chunks together) through the model
once. Its time is the sum of parts, each max(compute time, memory time) at calibrated efficiencies:

- linear layers: weights are read once per step whatever the batch (memory), GEMM FLOPs grow with every
  token (compute). Small batches are bandwidth-bound (the decode floor W / beta_eff), big prefills are
  compute-bound. Weight quantization shrinks the bytes and adds dequantisation work on the compute side.
- attention: decode reads each sequence's whole KV (bytes ~ context), prefill is FLOP-bound (~ n x ctx).
  FP8 KV halves the bytes read.
- a fixed per-step overhead (scheduling, input preparation, sampling) plus a small per-sequence part.

GEMM tile floor: a dense cuBLAS/CUTLASS GEMM of M tokens costs about M + 64 tokens of tensor work (big
tiles, wave quantisation). W4A16 (AWQ/GPTQ) and FP8-weight-only run on the Marlin kernel, which tiles M
by 16 and partitions the weights across every SM at any M, so its floor is 16 tokens: small-batch W4A16
decode stays memory-bound up to ~16-32 tokens, the near-4x speed-up over FP16 that Frantar et al. (2024,
"Marlin: Mixed-Precision Auto-Regressive Parallel Inference on LLMs") measure. A 64-token floor there made
a 72B AWQ step at batch 1 on A100 compute-bound (55 ms) where the weights stream in 29 ms.

Efficiencies are fitted to published vLLM measurements (docs/calibration.md), not chosen per scenario.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.profiles.models import QUANT_DEQUANT_FACTOR
from tuner.sim.config import ResolvedConfig


@dataclass(frozen=True)
class CostParams:
    bw_eff: float = 0.70          # achieved / peak HBM bandwidth for weight and KV streaming
    gemm_eff: float = 0.55        # achieved / peak tensor throughput for large GEMMs
    attn_eff: float = 0.50        # achieved / peak for (flash) attention FLOPs
    step_overhead_s: float = 0.0015
    per_seq_overhead_s: float = 8e-6
    gemm_half_tokens: float = 64.0  # GEMM efficiency is half its peak at this many tokens (tile/wave
    #                                 quantisation): small chunks cost more per token than big ones
    marlin_tile_tokens: float = 16.0  # the same floor for the Marlin mixed-precision kernel (M tiles of 16)
    #: Terms the nominal engine leaves at zero and the twin (`tuner.twin`) never fits: the hidden-truth
    #: benchmark turns them on to stand for a real engine's structure the cost model does not have.
    per_request_s: float = 0.0        # engine seconds per request whose prefill completes in the step
    attn_superlinear: float = 0.0     # decode attention slows by (1 + this x decoding sequences / 64)
    link_eff: float = 0.7             # achieved / peak GPU-to-GPU bandwidth in tensor-parallel all-reduces
    #: Speculative decoding. The per-position acceptance rate of each method (method, rate) pairs, as the
    #: user states it for this workload; a method not listed takes `tuner.speculative.PRIOR_ACCEPTANCE`.
    spec_acceptance: tuple[tuple[str, float], ...] = ()
    ngram_per_seq_s: float = 10e-6    # CPU prompt-lookup per sequence per step (an estimate)
    draft_overhead_share: float = 0.25  # a draft-head forward's fixed cost, as a share of step_overhead_s
    #                                    (an estimate: vLLM runs the drafter's passes in CUDA graphs)


class CostModel:
    """Step time for a batch, with everything that does not depend on the batch precomputed."""

    def __init__(self, cfg: ResolvedConfig, params: CostParams | None = None):
        p = self.params = params or CostParams()
        gpu, model = cfg.gpu, cfg.model
        fam = cfg.quantization
        native_fp8 = fam == "fp8" and gpu.fp8_native
        gemm_peak = (gpu.fp8_tflops if native_fp8 else gpu.bf16_tflops) * 1e12
        dequant = 1.0 if native_fp8 else QUANT_DEQUANT_FACTOR.get(fam, 1.0)
        if fam == "fp8" and not gpu.fp8_native:
            dequant = 1.15  # FP8 weight-only Marlin on Ampere
        marlin = fam in ("awq", "gptq") or (fam == "fp8" and not gpu.fp8_native)
        floor_tokens = p.marlin_tile_tokens if marlin else p.gemm_half_tokens
        # every figure is one GPU's: a tensor-parallel engine splits the weights, the GEMMs, the heads
        # (attention and the KV read) and the vocabulary TP ways, and all-reduces the hidden states twice
        # per layer (after attention and after the MLP) over the GPU-to-GPU link
        tp = cfg.tensor_parallel_size
        self._mem_bw = gpu.bandwidth * p.bw_eff
        self._weight_time = cfg.weight_bytes / self._mem_bw
        # seconds of GEMM compute per token through the decoder layers / the lm_head
        self._gemm_per_token = 2.0 * model.linear_params / tp * dequant / (gemm_peak * p.gemm_eff)
        # tile padding: a GEMM of M tokens costs about M + m_half tokens of tensor work (no dequant)
        self._gemm_floor = floor_tokens * 2.0 * model.linear_params / tp / (gemm_peak * p.gemm_eff)
        self._lm_head_per_token = 2.0 * model.lm_head_params() / tp / (gpu.bf16_tflops * 1e12 * p.gemm_eff)
        attn_peak = gpu.bf16_tflops * 1e12 * p.attn_eff
        # attention: 4 FLOPs per (query token, context token, head dim, head, layer): QK^T and AV
        self._attn_flop_per_pair = 4.0 * model.q_dim / tp * model.num_hidden_layers / attn_peak
        self._kv_read_per_token = cfg.kv_bytes_per_token_per_gpu / self._mem_bw
        # all-reduce of a step: 2 per layer, each a latency plus the ring's 2(TP-1)/TP of the bf16 hidden
        # states of every scheduled token over the link
        n_ar = 2 * model.num_hidden_layers if tp > 1 else 0
        self._ar_fixed = n_ar * gpu.link_latency_us * 1e-6
        self._ar_per_token = n_ar * (2 * (tp - 1) / tp) * model.hidden_size * 2 / (gpu.link_gbs * 1e9 * p.link_eff)
        self._overhead = p.step_overhead_s
        self._per_seq = p.per_seq_overhead_s
        self._per_request = p.per_request_s
        self._superlinear = p.attn_superlinear / 64.0
        # a learned drafter (EAGLE head, MTP layer): one decoder layer plus the lm_head per draft token
        layers = model.num_hidden_layers
        self._draft_weight_time = (cfg.weight_bytes / layers + 2.0 * model.lm_head_params() / tp) / self._mem_bw
        self._draft_per_token = self._gemm_per_token / layers + self._lm_head_per_token
        self._draft_kv_per_token = self._kv_read_per_token / layers
        self._draft_fixed = p.draft_overhead_share * p.step_overhead_s

    def draft_time(self, method: str, k: int, n_decode: int, decode_ctx: int) -> float:
        """The drafter's share of one speculative step: k proposals for each decoding sequence. ngram
        looks the prompt up on the CPU; a learned drafter runs k one-layer forwards of the batch."""
        if method == "ngram":
            return n_decode * self.params.ngram_per_seq_s
        one = max(self._draft_weight_time, n_decode * self._draft_per_token)
        return k * (self._draft_fixed + one + decode_ctx * self._draft_kv_per_token)

    def decode_floor(self) -> float:
        """TPOT at batch 1: the weights read once per token (REFERENCE.md: W / beta_eff)."""
        return self._weight_time

    def decode_terms(self, n_decode: int) -> tuple[float, float, float, float, float]:
        """`step_time` of a plain decode step (no prefill, width 1) split into what the batch size fixes and
        what the context moves: (fixed, attention FLOP per context token, KV read per context token,
        superlinear factor or 0, all-reduce seconds or 0). `tuner.sim.fused.decode_steps` runs millions of such
        steps; `fixed + dec (x factor) (+ all-reduce)` repeats `step_time`'s operations in its order, so the
        floats are the same (tests/unit/test_sim_engine_fast.py checks it)."""
        gemm = self._gemm_floor + n_decode * self._gemm_per_token + n_decode * self._lm_head_per_token
        linear = gemm if gemm > self._weight_time else self._weight_time
        fixed = self._overhead + self._per_seq * n_decode + linear
        factor = 1.0 + self._superlinear * n_decode if self._superlinear else 0.0
        ar = self._ar_fixed + n_decode * self._ar_per_token if self._ar_fixed else 0.0
        return fixed, self._attn_flop_per_pair, self._kv_read_per_token, factor, ar

    def step_time(self, prefill_tokens: int, prefill_pairs: float, prefill_kv_tokens: int,
                  n_decode: int, decode_ctx: int, n_logits: int, width: int = 1) -> float:
        """Seconds for one step.

        prefill_tokens: prefill tokens scheduled; prefill_pairs: sum over those tokens of the context each
        attends to; prefill_kv_tokens: KV tokens the chunks read or write; n_decode: decoding sequences;
        decode_ctx: their summed context length; n_logits: rows sampled (decodes + finished prefills);
        width: positions each decode verifies (k + 1 with speculative decoding: each a GEMM row, a sampled
        row and a query over the context; the context's KV is read once for all of them).
        """
        tokens = prefill_tokens + n_decode * width
        gemm = self._gemm_floor + tokens * self._gemm_per_token + n_logits * self._lm_head_per_token
        linear = gemm if gemm > self._weight_time else self._weight_time
        dec_c = n_decode and decode_ctx * width * self._attn_flop_per_pair
        dec_m = decode_ctx * self._kv_read_per_token
        pre_c = prefill_pairs * self._attn_flop_per_pair
        pre_m = prefill_kv_tokens * self._kv_read_per_token
        dec = dec_c if dec_c > dec_m else dec_m
        if self._superlinear:
            dec *= 1.0 + self._superlinear * n_decode
        attn = dec + (pre_c if pre_c > pre_m else pre_m)
        t = self._overhead + self._per_seq * (n_decode + (prefill_tokens > 0)) + linear + attn
        if self._ar_fixed:
            t += self._ar_fixed + tokens * self._ar_per_token
        if self._per_request and n_logits > n_decode * width:
            t += self._per_request * (n_logits - n_decode * width)
        return t


@dataclass(frozen=True)
class SingleStream:
    """One request alone on the engine, every step priced by `CostModel.step_time`: what no batching
    or scheduling knob can beat. Decode steps grow with the context (its KV is read every step)."""

    prefill_s: float          # every prefill chunk; the last one samples the first token (= TTFT)
    first_step_s: float       # the first decode step (context prompt + 1)
    last_step_s: float        # the last one (context prompt + output - 1): the request's largest gap
    decode_steps: int         # output - 1

    @property
    def mean_step_s(self) -> float:
        """Mean decode step (= the request's TPOT): the step is affine in the context, so the mean of
        the first and the last is exact."""
        return (self.first_step_s + self.last_step_s) / 2 if self.decode_steps else 0.0

    @property
    def e2e_s(self) -> float:
        return self.prefill_s + self.decode_steps * self.mean_step_s


def single_stream(cost: CostModel, prompt_tokens: int, output_tokens: int, *, cached_tokens: int = 0,
                  chunk_tokens: int | None = None) -> SingleStream:
    """The single-stream latencies the simulator's engine produces for one request on an idle engine:
    the prompt's uncached tokens in chunks of `chunk_tokens` (None: one chunk, the fastest any token
    budget allows), then one decode step per further output token. The capacity plan's feasibility
    floors come from here, so the plan and the simulator cannot disagree on the same hardware."""
    cached = max(0, min(cached_tokens, prompt_tokens - 1))  # vLLM always computes the last prompt token
    done, prefill = cached, 0.0
    chunk = chunk_tokens or prompt_tokens
    while done < prompt_tokens:
        n = min(chunk, prompt_tokens - done)
        last = done + n == prompt_tokens
        prefill += cost.step_time(n, n * done + n * (n + 1) / 2, done + n, 0, 0, 1 if last else 0)
        done += n
    k = max(output_tokens - 1, 0)
    first = cost.step_time(0, 0.0, 0, 1, prompt_tokens + 1, 1) if k else 0.0
    last_step = cost.step_time(0, 0.0, 0, 1, prompt_tokens + k, 1) if k else 0.0
    return SingleStream(prefill_s=prefill, first_step_s=first, last_step_s=last_step, decode_steps=k)
