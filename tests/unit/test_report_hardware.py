"""What a report says of the hardware and of the command it hands over (issue 33, item 6)."""

from __future__ import annotations

import shlex

import yaml

from tuner.plan import format_plan, make_plan
from tuner.profiles.host import describe_host, is_cpu_host
from tuner.report.build import Spread, config_yaml, effective_floor, hardware, serve_command
from tuner.storage.records import StudyInfo

EXTRA = ["--enforce-eager", "--kv-cache-memory-bytes", "4194304", "--dtype=bfloat16"]


def _info(**kw) -> StudyInfo:
    base = dict(workload_path="w.jsonl", workload_sha256="0", workload_requests=1, workload_mean_prompt_tokens=1,
                workload_mean_output_tokens=1, slo_path="s.yaml", slo_sha256="0", slo={}, engine="vllm",
                simulated=False)
    return StudyInfo(**{**base, **kw})


def test_the_tuned_command_and_config_carry_every_server_argument_the_launches_used():
    cmd = shlex.split(serve_command("m", {"max_num_seqs": 64}, EXTRA))
    assert cmd[:3] == ["vllm", "serve", "m"] and "--max-num-seqs" in cmd
    assert cmd[-4:] == EXTRA
    cfg = yaml.safe_load(config_yaml("m", {"max_num_seqs": 64}, EXTRA).split("\n", 2)[2])
    assert cfg == {"max-num-seqs": 64, "enforce-eager": True, "kv-cache-memory-bytes": "4194304",
                   "dtype": "bfloat16"}
    # the defaults were best: the other arguments are still what was measured
    assert yaml.safe_load(config_yaml("m", {}, ["--enforce-eager"]).split("\n", 2)[2]) == {"enforce-eager": True}


def test_a_real_engines_report_names_the_host_it_ran_on_never_a_gpu_it_did_not_have():
    cpu = _info(host="CPU host (2 cores, x86_64), no GPU visible")
    assert hardware(cpu) == "CPU host (2 cores, x86_64), no GPU visible"
    assert "GPU" not in hardware(_info(host="")).replace("no GPU", "") and hardware(_info()) == "this host"
    assert hardware(_info(simulated=True, engine="sim", gpu="rtx4090")) == "rtx4090"
    assert describe_host()  # this machine: a GPU list or a CPU host, never empty
    assert is_cpu_host(cpu.host) and not is_cpu_host("1 x NVIDIA H100 80GB HBM3")


def test_a_plan_on_a_cpu_host_counts_hosts_not_gpus():
    plan = make_plan(rate_per_instance=10.0, peak_rate=50.0, headroom=0.7)
    plan.device = "CPU host"
    text = format_plan(plan)
    assert "GPUs" not in text and "CPU hosts: 8, one server each" in text


def test_the_noise_floor_is_never_below_a_measured_launch_spread():
    spreads = [Spread("vLLM's defaults (trials 0, 1)", [32.0, 25.8])]
    assert abs(spreads[0].spread - 32.0 / 25.8 + 1) < 1e-12
    assert effective_floor(0.05, spreads) > 0.24 and effective_floor(0.05, []) == 0.05
