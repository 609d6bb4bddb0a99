"""Fast launcher pieces: command building, port checks, /proc and nvidia-smi parsing."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from tuner.engine import launcher, procs
from tuner.engine.vllm import VllmEngine, render_command
from tuner.errors import UserError
from tuner.knobs import Knobs


def test_template_expands_args_as_separate_tokens_and_quoted_inside_a_token():
    argv = render_command("docker run -p {port}:8000 img --model {model} --host {host} {args}",
                          model="Qwen/Qwen2.5-7B", host="0.0.0.0", port=9000,
                          args=["--max-num-seqs", "64", "--served-model-name", "a b"])
    assert argv == ["docker", "run", "-p", "9000:8000", "img", "--model", "Qwen/Qwen2.5-7B", "--host", "0.0.0.0",
                    "--max-num-seqs", "64", "--served-model-name", "a b"]
    remote = render_command("ssh gpu1 'vllm serve {model} --port {port} {args}'", model="m", host="h",
                            port=1, args=["--served-model-name", "a b"])
    assert remote == ["ssh", "gpu1", "vllm serve m --port 1 --served-model-name 'a b'"]


@pytest.mark.parametrize("template", ["", "   ", "vllm serve 'unclosed"])
def test_bad_templates_are_user_errors(template):
    with pytest.raises(UserError):
        render_command(template, model="m", host="h", port=1, args=[])


def test_vllm_argv_forms(tmp_path):
    knobs = Knobs(max_num_seqs=8, enable_prefix_caching=False)
    py = VllmEngine("/models/tiny", run_root=tmp_path, python="/venv/bin/python", served_model_name="tiny",
                    extra_args=["--enforce-eager"])
    assert py.argv(knobs, 8123) == [
        "/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/tiny",
        "--host", "127.0.0.1", "--port", "8123", "--served-model-name", "tiny",
        "--max-num-seqs", "8", "--no-enable-prefix-caching", "--enforce-eager"]
    cmd = VllmEngine("m", run_root=tmp_path, command="wrap --p {port} -- {args}")
    assert cmd.argv(Knobs(max_model_len=4096), 7) == ["wrap", "--p", "7", "--", "--max-model-len", "4096"]
    assert py.model_name == "tiny" and cmd.model_name == "m"


def test_lora_adapters_enable_lora_before_the_knobs(tmp_path):
    """A workload's adapters become `--enable-lora --lora-modules name=path ...`; the LoRA knobs (among the
    knob flags) come after, the user's extra args last. No adapters: no LoRA flag at all."""
    py = VllmEngine("/models/tiny", run_root=tmp_path, python="/venv/bin/python", extra_args=["--enforce-eager"],
                    lora_modules=["t0=/loras/t0", "t1=/loras/t1"])
    argv = py.argv(Knobs(max_num_seqs=8), 8123)
    assert argv[argv.index("--port") + 2:] == ["--enable-lora", "--lora-modules", "t0=/loras/t0", "t1=/loras/t1",
                                                "--max-num-seqs", "8", "--enforce-eager"]
    plain = VllmEngine("/models/tiny", run_root=tmp_path, python="/venv/bin/python").argv(Knobs(), 1)
    assert not any("lora" in a for a in plain)


def test_lora_dir_gives_the_launch_its_adapters_and_a_names_only_catalog_is_refused(tmp_path):
    from tuner.engine.vllm import lora_modules_of
    from tuner.testing.tiny_lora import build_adapters

    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text('{"hidden_size": 8, "intermediate_size": 16, '
                                                   '"num_attention_heads": 2, "num_hidden_layers": 1}')
    made = build_adapters(tmp_path / "base", tmp_path / "loras", count=2, rank=1)
    assert lora_modules_of(str(tmp_path / "loras")) == [f"{n}={p.resolve()}" for n, p in made.items()]
    assert lora_modules_of(None) == []
    names_only = tmp_path / "cat.yaml"
    names_only.write_text("rank: 8\nadapters: [a, b]\n")
    with pytest.raises(UserError, match="names-only catalog"):
        lora_modules_of(str(names_only))


def test_default_form_needs_vllm_on_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError, match="not on PATH"):
        VllmEngine("m", run_root=tmp_path).argv(Knobs(), 1)
    exe = tmp_path / "vllm"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert VllmEngine("m", run_root=tmp_path).argv(Knobs(), 5)[:3] == [str(exe), "serve", "m"]


@pytest.mark.parametrize("kwargs,match", [
    ({"extra_args": ["--api-key", "s3cret"]}, "VLLM_API_KEY"),
    ({"extra_args": ["--api-key=s3cret"]}, "VLLM_API_KEY"),
    ({"extra_args": ["--port", "1"]}, "set by the tuner"),
    ({"command": "vllm serve {model}"}, "no {port}"),
    ({"command": "x {port}", "python": "/p"}, "not both"),
    ({"lora_modules": ["a=/x", "a=/y"]}, "'a' is given twice"),
    ({"lora_modules": ["a"]}, "must be name=path"),
    ({"lora_modules": ["a=/x"], "extra_args": ["--lora-modules", "b=/y"]}, "drop it from --vllm-arg"),
])
def test_engine_options_that_are_user_errors(tmp_path, kwargs, match):
    with pytest.raises(UserError, match=match):
        VllmEngine("m", run_root=tmp_path, **kwargs)


def test_fixed_port_template_without_placeholder_is_allowed(tmp_path):
    e = VllmEngine("m", run_root=tmp_path, command="run-my-server", port=8000)
    assert e.argv(Knobs(), 8000) == ["run-my-server"]


def test_port_checks():
    port = launcher.free_port()
    assert launcher.port_is_free("127.0.0.1", port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert not launcher.port_is_free("127.0.0.1", port)
        assert not launcher.wait_port_free("127.0.0.1", port, 0.3)
    assert launcher.wait_port_free("127.0.0.1", port, 5)


def test_proc_reading_on_this_process():
    me = os.getpid()
    assert me in procs.group_members(os.getpgid(0))
    assert procs.start_ticks(me) and procs.is_alive(me)
    assert procs.snapshot([me, 10 ** 9]) == [(me, procs.start_ticks(me))]
    assert procs.has_env(me, "TUNER_UNIT_MARK", "x") is (os.environ.get("TUNER_UNIT_MARK") == "x")
    assert procs.start_ticks(10 ** 9) is None and procs.group_members(10 ** 9) == []


def test_owned_members_needs_a_token_or_a_recorded_member():
    pgid = os.getpgid(0)
    me = os.getpid()
    assert procs.owned_members(pgid, "TUNER_NO_SUCH_KEY", "x") == []
    assert me in procs.owned_members(pgid, "TUNER_NO_SUCH_KEY", "x", [(me, procs.start_ticks(me))])
    # A recorded pid whose start time differs is a different (recycled) process: not proof.
    assert procs.owned_members(pgid, "TUNER_NO_SUCH_KEY", "x", [(me, procs.start_ticks(me) - 1)]) == []


def test_parse_nvidia_smi_compute_apps():
    text = "1234, 40960 MiB\n5678, 512\n\nNo running processes found\n"
    assert procs.parse_compute_apps(text) == {1234: 40960, 5678: 512}


def test_gpu_wait_is_immediate_without_nvidia_smi(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert procs.gpu_pids() is None
    assert procs.wait_gpu_released({os.getpid()}, timeout_s=0)


def test_gpu_wait_polls_a_fake_nvidia_smi(monkeypatch, tmp_path):
    """A fake `nvidia-smi` lists our pid until a file appears: the wait must last until then."""
    flag = tmp_path / "released"
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!{sys.executable}\nimport os\n"
                   f"print('' if os.path.exists({str(flag)!r}) else '{os.getpid()}, 1000 MiB')\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert procs.gpu_pids() == {os.getpid(): 1000}
    assert not procs.wait_gpu_released({os.getpid()}, timeout_s=0.3, interval_s=0.1)
    flag.write_text("")
    assert procs.wait_gpu_released({os.getpid()}, timeout_s=5, interval_s=0.1)
