"""The PyTorch front end: the user's torch step captured under fake tensors and simulated.

The tests run, not skip, in CI: the test extra pins the CPU build of torch these machines
install (pyproject.toml).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="the test extra installs torch: pip install '.[test]'")

import simulator
from simulator.capture import (
    CaptureError,
    TorchMissingError,
    UnmappedOpsWarning,
    run_torch,
    unmapped_ops,
)
from simulator.profile import Profile

pytest_plugins = ["pytester"]


class Block(torch.nn.Module):
    """One pre-norm attention block: LayerNorm, fused QKV projection, causal SDPA, output projection."""

    def __init__(self, hidden: int = 512, heads: int = 8) -> None:
        super().__init__()
        self.heads = heads
        self.norm = torch.nn.LayerNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden, bias=False)
        self.out = torch.nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.out(attn.transpose(1, 2).reshape(b, s, h))


def setup_block():
    torch.set_default_dtype(torch.bfloat16)  # the Cube unit has no fp32 rate (test_an_fp32_matmul_...)
    model = Block()
    return model, torch.optim.AdamW(model.parameters(), foreach=True), torch.randn(2, 1024, 512)


def train_step(model, opt, x):
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()


def op_counts(profile: Profile) -> dict[str, int]:
    counts: dict[str, int] = {}
    for op in profile.ops:
        counts[op.op_type] = counts.get(op.op_type, 0) + 1
    return counts


@pytest.fixture(autouse=True)
def _default_dtype():
    before = torch.get_default_dtype()
    yield
    torch.set_default_dtype(before)


def test_a_training_step_becomes_the_simulators_ops():
    profile = run_torch(train_step, setup=setup_block, hardware="ascend910b")
    counts = op_counts(profile)
    # forward: qkv and out projections (2 mm); backward: a gradient for the input and one for
    # the weight of each (4 mm)
    assert counts["MatMul"] == 6
    assert counts["FlashAttention"] == 1 and counts["FlashAttentionGrad"] == 1
    assert counts["LayerNorm"] == 1 and counts["LayerNormGrad"] == 1
    assert any(op.startswith("Foreach") for op in counts), counts  # AdamW(foreach=True)
    assert profile.hardware == "ascend910b" and profile.steps == 1


def test_shapes_and_attributes_are_the_captured_ones():
    profile = run_torch(train_step, setup=setup_block, hardware="ascend910b")
    matmuls = [op for op in profile.ops if op.op_type == "MatMul"]
    # the qkv projection: x (2 x 1024 tokens, 512) @ W^T (512, 1536): M = 2048, K = 512, N = 1536
    assert matmuls[0].input_shapes == [[1, 2048, 512], [1, 512, 1536]]
    flash = next(op for op in profile.ops if op.op_type == "FlashAttention")
    # q, k, v (batch 2, 8 heads, 1024 positions, 512 / 8 = 64 per head); is_causal=True
    assert flash.input_shapes == [[2, 8, 1024, 64]] * 3
    assert flash.attrs["causal"] is True


def test_ops_name_the_users_lines_forward_and_backward():
    profile = run_torch(train_step, setup=setup_block, hardware="ascend910b")
    sdpa_line = Block.forward.__code__.co_firstlineno + 3  # the scaled_dot_product_attention line
    for op_type in ("FlashAttention", "FlashAttentionGrad"):
        op = next(op for op in profile.ops if op.op_type == op_type)
        assert op.source == f"{__file__}:{sdpa_line}", (op_type, op.source)


def test_the_same_step_gives_the_same_profile():
    first = run_torch(train_step, setup=setup_block, steps=2, memory=True, hardware="ascend910b")
    second = run_torch(train_step, setup=setup_block, steps=2, memory=True, hardware="ascend910b")
    assert first.model_dump() == second.model_dump()


def test_default_dtype_set_in_setup_does_not_leak():
    profile = run_torch(train_step, setup=setup_block, hardware="ascend910b")
    assert torch.get_default_dtype() == torch.float32
    assert {op.dtype for op in profile.ops if op.op_type == "MatMul"} == {"bf16"}


def test_recompute_trades_time_for_memory():
    """torch.utils.checkpoint (activation recompute) shows its real effect: a lower peak, a
    longer step (the forward of each checkpointed layer runs twice)."""

    class Stack(torch.nn.Module):
        def __init__(self, checkpoint: bool) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(Block() for _ in range(4))
            self.checkpoint = checkpoint

        def forward(self, x):
            for layer in self.layers:
                x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False) if self.checkpoint else layer(x)
            return x

    def run(checkpoint: bool) -> Profile:
        def setup():
            torch.set_default_dtype(torch.bfloat16)
            model = Stack(checkpoint)
            return model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(4, 2048, 512)

        return run_torch(train_step, setup=setup, memory=True, hardware="ascend910b")

    plain, recomputed = run(False), run(True)
    assert recomputed.memory_peak.allocated_bytes < plain.memory_peak.allocated_bytes
    assert op_counts(recomputed)["FlashAttention"] == 2 * op_counts(plain)["FlashAttention"] == 8
    assert sum(recomputed.step_times_s) > sum(plain.step_times_s)


def test_tensors_free_their_memory_when_their_storage_dies():
    """A temporary's memory is given back once nothing holds its storage: running the same
    step twice must not grow the allocated memory at the end of a step."""
    profile = run_torch(train_step, setup=setup_block, steps=3, memory=True, hardware="ascend910b")
    ends = [step.allocated_end_bytes for step in profile.memory]
    assert ends[1] == ends[2], ends


def test_a_tensor_gives_its_memory_back_when_the_last_reference_goes():
    """Golden peak: x (1 MiB, fp32, held by the step's arguments) doubled 8 times, each result
    replacing the last. While an op runs, its input and its new output are live besides x:
    3 MiB at most, whatever the count. (A reference cycle in the recorder once kept all nine
    alive until the end of the step: 9 MiB.) Each 1 MiB request takes 1 MiB + 512 B of the
    caching allocator model (torch_npu's allocator pads each request by 32 bytes and rounds
    up to 512: simulator.allocator)."""
    def step(x):
        for _ in range(8):
            x = x * 2

    profile = run_torch(step, torch.randn(512, 512), memory=True, hardware="ascend910b")
    assert profile.memory_peak.allocated_bytes == 3 * (512 * 512 * 4 + 512)


def test_tensors_saved_for_backward_live_until_backward_uses_them():
    """y = exp(x) is saved by autograd for exp's backward; z = y.sum() drops the Python name y.
    The saved storage must stay on the card until backward (peak: x, y and the gradient of y
    at least: 3 MiB), and after the step only x remains with its gradient."""
    def setup():
        return (torch.randn(512, 512, requires_grad=True),)

    def step(x):
        y = torch.exp(x)
        z = y.sum()
        del y
        z.backward()

    profile = run_torch(step, setup=setup, memory=True, hardware="ascend910b")
    mib = 512 * 512 * 4
    assert profile.memory_peak.allocated_bytes >= 3 * mib
    # x and x.grad are left (plus the 0-dim loss's bytes, rounded up by the allocator to 512)
    assert 2 * mib <= profile.memory[0].allocated_end_bytes < 2 * mib + 4096


def test_unmapped_operators_are_costed_named_and_warned():
    def step(x):
        torch.cumsum(x, dim=0).sum()  # cumsum has no mapping: aten::cumsum

    with pytest.warns(UnmappedOpsWarning, match=r"1 op of 1 unmapped type costed generically.*aten::cumsum \(1\)"):
        profile = run_torch(step, torch.randn(1024, 1024))
    assert unmapped_ops(profile) == {"aten::cumsum": 1}
    cumsum = next(op for op in profile.ops if op.op_type == "aten::cumsum")
    # reads and writes 1024 x 1024 fp32: 4 MiB each way
    assert cumsum.attrs["read_bytes"] == cumsum.attrs["write_bytes"] == 4 * 1024 * 1024
    assert cumsum.duration_s > 0


def test_a_data_dependent_branch_names_the_users_line():
    def step(x):
        if x.sum() > 0:  # the line the error must name
            x = x * 2
        return x

    line = step.__code__.co_firstlineno + 1
    with pytest.raises(CaptureError, match=rf"{__file__}:{line}: .*needs the values of a tensor.*attention_mask=None"):
        run_torch(step, torch.randn(4))


@pytest.mark.parametrize("code, what", [
    ("x.nonzero()", "nonzero"),
    ("x[x > 0]", "nonzero"),
    ("x.max().item()", "_local_scalar_dense"),
])
def test_data_dependent_ops_are_clear_errors(code, what):
    def step(x):
        return eval(code)

    with pytest.raises(CaptureError, match=what):
        run_torch(step, torch.randn(8))


def test_a_cuda_only_call_is_a_clear_error():
    def step(x):
        return x.cuda()

    line = step.__code__.co_firstlineno + 1
    with pytest.raises(CaptureError, match=rf"{__file__}:{line}: .*cuda.*fake CPU tensors"):
        run_torch(step, torch.randn(8))


def test_an_fp32_matmul_says_to_run_in_bf16():
    def step(a, b):
        return a @ b  # fp32

    line = step.__code__.co_firstlineno + 1
    with pytest.raises(CaptureError, match=rf"{__file__}:{line}: aten.mm.default as MatMul .* fp32 on ascend910b: "
                                           r".*no fp32 rate.*run the step in bf16 or fp16"):
        run_torch(step, torch.randn(64, 64), torch.randn(64, 64), hardware="ascend910b")


def test_bad_arguments():
    with pytest.raises(TypeError, match="step must be a function"):
        run_torch("train_step")
    with pytest.raises(TypeError, match="setup must be a function"):
        run_torch(train_step, setup=42)
    with pytest.raises(CaptureError, match="setup .* returned None: return what the step takes first"):
        run_torch(train_step, setup=lambda: None)
    with pytest.raises(CaptureError, match=r"setup .* returned 1 value, then 0 arguments .*missing a required argument"):
        run_torch(train_step, setup=lambda: torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        run_torch(train_step, setup=setup_block, steps=0)
    with pytest.raises(ValueError, match="3"):
        run_torch(train_step, setup=setup_block, devices=3)  # HCCL has no 3-card group in a 910 server


def test_torch_missing_is_a_clear_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    with pytest.raises(TorchMissingError, match=r"pip install 'pytest-oam\[torch\]'"):
        run_torch(train_step, setup=setup_block)


def test_importing_the_simulator_and_the_plugin_imports_no_torch():
    code = "import sys, simulator, pytest_oam.plugin; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_simulator_run_torch_is_the_capture():
    profile = simulator.run_torch(train_step, setup=setup_block, hardware="ascend910b")
    assert op_counts(profile)["FlashAttention"] == 1


# -- through the plugin ------------------------------------------------------------------------

MODEL = textwrap.dedent('''
    import torch

    ATTENTION = "{attention}"

    class Block(torch.nn.Module):
        def __init__(self, hidden=512, heads=8):
            super().__init__()
            self.heads = heads
            self.qkv = torch.nn.Linear(hidden, 3 * hidden, bias=False)
            self.out = torch.nn.Linear(hidden, hidden, bias=False)

        def forward(self, x):
            b, s, h = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
            if ATTENTION == "sdpa":
                a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            else:
                a = torch.softmax(q @ k.transpose(-2, -1) / 8.0, dim=-1) @ v  # SOFTMAX LINE
            return self.out(a.transpose(1, 2).reshape(b, s, h))

    def setup():
        torch.set_default_dtype(torch.bfloat16)
        model = Block()
        return model, torch.optim.AdamW(model.parameters(), foreach=True), torch.randn(2, 1024, 512)

    def train_step(model, opt, x):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    def test_block(oam_profile):
        oam_profile.run_torch(train_step, setup=setup, hardware="ascend910b")
''')


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_gate_passes_an_unchanged_step_and_names_the_new_softmax_line(pytester, xdist):
    pytester.makepyfile(test_model=MODEL.format(attention="sdpa"))
    saved = pytester.runpytest_subprocess("--oam-save-baseline", *xdist)
    saved.assert_outcomes(passed=1)
    again = pytester.runpytest_subprocess("--oam-baseline", *xdist)
    again.assert_outcomes(passed=1)

    pytester.makepyfile(test_model=MODEL.format(attention="math"))
    changed = pytester.runpytest_subprocess("--oam-baseline", *xdist)
    changed.assert_outcomes(failed=1)
    text = changed.stdout.str()
    softmax_line = MODEL.splitlines().index(next(line for line in MODEL.splitlines() if "SOFTMAX LINE" in line)) + 1
    assert "Softmax" in text
    assert f"test_model.py:{softmax_line}" in text, text


def test_gate_fails_a_data_dependent_step_at_the_users_line(pytester):
    pytester.makepyfile(test_branch='''
        import torch

        def step(x):
            if x.mean() > 0:
                x = x * 2
            return x

        def test_branch(oam_profile):
            oam_profile.run_torch(step, torch.randn(16))
    ''')
    result = pytester.runpytest_subprocess("--oam-baseline")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*test_branch.py:4: aten._local_scalar_dense.default needs the values of a tensor*"])
    result.stdout.no_fnmatch_line("*Traceback*")
    result.stdout.no_fnmatch_line("*During handling of the above exception*")


def test_strict_fails_a_step_with_unmapped_operators(pytester):
    pytester.makepyfile(test_cumsum='''
        import torch

        def step(x):
            return torch.cumsum(x, dim=0)

        def test_cumsum(oam_profile):
            oam_profile.run_torch(step, torch.randn(256, 256))
    ''')
    loose = pytester.runpytest_subprocess("--oam-save-baseline")
    loose.assert_outcomes(passed=1, warnings=1)
    loose.stdout.fnmatch_lines(["*1 op of 1 unmapped type costed generically*aten::cumsum (1)*"])
    strict = pytester.runpytest_subprocess("--oam-baseline", "--oam-strict")
    strict.assert_outcomes(failed=1)
    strict.stdout.fnmatch_lines(["*aten::cumsum*--oam-strict fails a step with operators the simulator does not model*"])


def test_bf16_on_the_910_says_to_use_fp16_or_the_910b():
    with pytest.raises(CaptureError, match=r"no bf16 rate.*run the step in fp16.*ascend910b"):
        run_torch(train_step, setup=setup_block, hardware="ascend910")


# -- the command line --------------------------------------------------------------------------

STEP_FILE = '''
import torch

def setup():
    torch.set_default_dtype(torch.bfloat16)
    model = torch.nn.Linear(1024, 1024)
    return model, torch.randn(64, 1024)

def step(model, x):
    model(x).sum().backward()
'''


def test_oam_collect_captures_a_torch_step(tmp_path, monkeypatch):
    from pytest_oam.cli import main

    (tmp_path / "mystep.py").write_text(STEP_FILE)
    monkeypatch.chdir(tmp_path)
    assert main(["collect", "--torch", "mystep.py:step", "--setup", "mystep.py:setup", "--hardware",
                 "ascend910b x 8", "--steps", "2", "-o", "p.json"]) == 0
    profile = Profile.model_validate_json((tmp_path / "p.json").read_text())
    assert (profile.hardware, profile.devices, profile.steps) == ("ascend910b", 8, 2)
    # forward addmm (MatMul), backward: the weight's gradient only (x needs none): 2 per step
    assert op_counts(profile)["MatMul"] == 4
    # the module form, from the current folder, and the rest of the CLI reads the profile
    assert main(["collect", "--torch", "mystep:step", "--setup", "mystep:setup", "--hardware", "ascend910b",
                 "-o", "q.json"]) == 0
    assert main(["compare", "q.json", "q.json"]) == 0


@pytest.mark.parametrize("argv, message", [
    (["--torch", "nosuch:step"], "--torch 'nosuch:step': no module 'nosuch'"),
    (["--torch", "mystep.py:nope"], "mystep.py has nothing named 'nope', not a function"),
    (["--torch", "missing.py:step"], "missing.py: no such file"),
    (["--torch", "mystep.py"], "expected MODULE:FUNCTION"),
    (["--torch", "mystep.py:step", "--param", "fusion=false"], "--param fusion describe a zoo model"),
    # these three have defaults for zoo models; given with --torch they were once ignored silently
    (["--torch", "mystep.py:step", "--dataset", "wikitext-2"], "--dataset describe a zoo model"),
    (["--torch", "mystep.py:step", "--seed", "3", "--max-seq-len", "128"], "--max-seq-len, --seed describe"),
    (["--model", "llama-7b", "--setup", "mystep.py:setup"], "--setup goes with --torch"),
    (["--torch", "broken.py:step"], r"importing broken.py failed: ZeroDivisionError: division by zero"),
    (["--torch", "mystep.py:step"], r"step\(model, x\) cannot take what it is given \(no setup, then 0 arguments"),
    (["--torch", "mystep.py:step", "--setup", "mystep.py:setup"], r"mystep.py:10: .* on ascend910: .*no bf16"),
])
def test_oam_collect_torch_bad_input(tmp_path, monkeypatch, capsys, argv, message):
    from pytest_oam.cli import main

    (tmp_path / "mystep.py").write_text(STEP_FILE)
    (tmp_path / "broken.py").write_text("1 / 0\n")
    monkeypatch.chdir(tmp_path)
    code = main(["collect", *argv, "-o", "out.json"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    import re

    assert re.search(message, err), err
    assert not (tmp_path / "out.json").exists()


# -- found by a newcomer's trial -----------------------------------------------------------------

def bf16_linear():
    torch.set_default_dtype(torch.bfloat16)
    return torch.nn.Linear(1024, 1024), torch.randn(64, 1024)


def test_inference_mode_decomposes_linear_and_attention():
    """Under torch.inference_mode composite operators reach the dispatcher whole
    (aten.linear, aten.scaled_dot_product_attention): they are costed by their parts, a MatMul
    and a FlashAttention, not as generic ops."""
    def step(model, x):
        with torch.inference_mode():
            model(x)
            q = torch.randn(2, 8, 256, 64)
            torch.nn.functional.scaled_dot_product_attention(q, q, q)

    profile = run_torch(step, setup=bf16_linear, hardware="ascend910b")
    assert [op for op in op_counts(profile) if op.startswith("aten::")] == []
    assert op_counts(profile)["MatMul"] == 1 and op_counts(profile)["FlashAttention"] == 1


def test_a_deep_copied_module_has_no_phantom_copies():
    """copy.deepcopy (nn.TransformerEncoder clones its layer so) gives parameters of another fake
    mode; the transpose of their weight is a view, not a copy."""
    import copy

    def setup():
        model, x = bf16_linear()
        return copy.deepcopy(model), x

    def step(model, x):
        with torch.no_grad():
            model(x)

    assert op_counts(run_torch(step, setup=setup, hardware="ascend910b")) == {"MatMul": 1}


def test_attention_with_dropout_runs_fused():
    """PyTorch's CPU fallback for attention with dropout is fp32 matmuls; torch_npu runs the
    fused kernel: the capture does too, and keeps the probability."""
    def setup():
        torch.set_default_dtype(torch.bfloat16)
        return torch.nn.TransformerEncoderLayer(512, 8, batch_first=True), torch.randn(4, 256, 512)  # dropout 0.1

    def step(model, x):
        model(x).float().sum().backward()

    profile = run_torch(step, setup=setup, hardware="ascend910b")
    flash = next(op for op in profile.ops if op.op_type == "FlashAttention")
    assert flash.attrs["dropout_p"] == pytest.approx(0.1)
    assert "BatchMatMul" not in op_counts(profile)


def test_the_warm_up_step_is_not_simulated():
    """The optimizer makes its state (AdamW's zeros) in its first step: with the default warm-up
    the simulated step is the steady state, without it the zeros are in it."""
    cold = run_torch(train_step, setup=setup_block, hardware="ascend910b", warmup_steps=0)
    warm = run_torch(train_step, setup=setup_block, hardware="ascend910b")
    assert op_counts(cold)["Fill"] > op_counts(warm).get("Fill", 0)
    assert warm.step_times_s[0] < cold.step_times_s[0]
    with pytest.raises(ValueError, match="warmup_steps must be an integer >= 0"):
        run_torch(train_step, setup=setup_block, warmup_steps=-1)


def test_global_torch_state_is_restored_after_an_error():
    def step(x):
        torch.set_grad_enabled(False)
        torch.set_float32_matmul_precision("medium")
        raise RuntimeError("the user's own error")

    with pytest.raises(RuntimeError, match="the user's own error"):
        run_torch(step, torch.randn(2))
    assert torch.is_grad_enabled() and torch.get_float32_matmul_precision() == "highest"


def test_moving_a_fake_model_is_a_clear_error():
    def setup():
        model, x = bf16_linear()
        return model.to(torch.float16), x  # the line the error names

    line = setup.__code__.co_firstlineno + 2
    with pytest.raises(CaptureError, match=rf"{__file__}:{line}: .*Couldn't swap.*build the model in its training dtype"):
        run_torch(lambda model, x: model(x), setup=setup, hardware="ascend910b")


def test_a_real_model_is_refused_and_left_untouched():
    real = torch.nn.Linear(64, 64)

    def step(x):
        real(x).sum().backward()

    with pytest.raises(CaptureError, match="real tensor \\[64, 64\\] that requires grad.*Build the model in setup"):
        run_torch(step, torch.randn(4, 64), hardware="ascend910b")
    assert real.weight.grad is None


def test_convolutions_and_pools_are_mapped():
    def setup():
        torch.set_default_dtype(torch.float16)
        model = torch.nn.Sequential(torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.BatchNorm2d(128),
                                    torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1))
        return model, torch.randn(8, 64, 56, 56)

    def step(model, x):
        model(x).float().sum().backward()

    counts = op_counts(run_torch(step, setup=setup, hardware="ascend910"))
    assert not [op for op in counts if op.startswith("aten::")], counts
    # the input needs no gradient: the filter's (and the bias's, a ReduceSum) only
    assert counts["Conv2D"] == counts["Conv2DBackpropFilter"] == 1 and "Conv2DBackpropInput" not in counts
    assert counts["MaxPool"] == counts["MaxPoolGrad"] == 1


def test_hardware_with_a_card_count_says_to_use_devices():
    with pytest.raises(ValueError, match="card count as devices=N"):
        run_torch(train_step, setup=setup_block, hardware="ascend910b x 4")


def _hardware_file(folder, name: str = "my-npu") -> str:
    """A hardware file (as oam calibrate writes one): the bundled 910B's figures under another name."""
    import json
    from importlib.resources import files

    data = json.loads(files("simulator").joinpath("hardware", "ascend910b.json").read_text(encoding="utf-8"))
    data["name"] = name
    path = folder / f"{name}.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def test_a_hardware_files_path_is_a_card(tmp_path, monkeypatch):
    # Newcomer: run_torch refused hardware="./my-npu.json" (the file oam calibrate writes) as if it
    # were "ascend910b x 4", while simulator.run and oam_profile.run take it.
    _hardware_file(tmp_path)
    monkeypatch.chdir(tmp_path)
    for given in ("./my-npu.json", str(tmp_path / "my-npu.json")):
        assert run_torch(train_step, setup=setup_block, hardware=given).hardware == "my-npu"


def test_oam_hardware_file_drives_a_torch_test(pytester):
    """--oam-hardware FILE reaches run_torch in a test: it passed a ValueError traceback before."""
    _hardware_file(pytester.path)
    pytester.makepyfile(test_step="""
        import torch

        def setup():
            torch.set_default_dtype(torch.bfloat16)
            return (torch.randn(256, 256),)

        def step(x):
            (x @ x).relu()

        def test_step(oam_profile):
            assert oam_profile.run_torch(step, setup=setup).hardware == "my-npu"
    """)
    pytester.runpytest_subprocess("-p", "no:randomly", "--oam-hardware", "./my-npu.json").assert_outcomes(passed=1)


def test_out_of_memory_names_the_users_line():
    """Without memory modelling an out-of-memory error named the simulator's own file
    (capture/recorder.py) as where the tensor was made, for a tensor of setup, of the warm-up
    or of an allocation (torch.empty): the user's line it came from, as docs/memory.md says."""
    from simulator import OutOfMemoryError

    def setup():
        torch.set_default_dtype(torch.bfloat16)
        return (torch.randn(1 << 36),)  # 128 GiB: more than the 910B's HBM

    def step(x):
        return torch.empty(1 << 36)

    def small():
        return (torch.randn(16, dtype=torch.bfloat16),)

    for made, function, line in ((setup, lambda x: x, setup.__code__.co_firstlineno + 2),
                                 (small, step, step.__code__.co_firstlineno + 1)):
        with pytest.raises(OutOfMemoryError) as raised:
            run_torch(function, setup=made, hardware="ascend910b")
        assert f"a tensor made at {__file__}:{line}," in str(raised.value), str(raised.value)


def test_tuning_a_torch_steps_keyword_argument():
    """auto_tune searches a captured step's keyword arguments: fused attention against the
    softmax(q k^T) v it replaces; the fused kernel is faster on the card, so it is the optimum."""
    from pytest_oam import OptimizationTarget, ParameterSpace, auto_tune

    def setup():
        torch.set_default_dtype(torch.bfloat16)
        return (torch.randn(2, 8, 1024, 64),)

    def attention(q, fused=False):
        if fused:
            return torch.nn.functional.scaled_dot_product_attention(q, q, q)
        return torch.softmax(q @ q.transpose(-2, -1) / 8.0, dim=-1) @ q

    result = auto_tune(target=OptimizationTarget(metric="latency_s"),
                       param_space=ParameterSpace().add_discrete("fused", [False, True]),
                       workload=attention, torch_setup=setup, hardware="ascend910b")
    assert result.best.params == {"fused": True}
    assert result.default.params == {} and result.default.metrics["latency_s"] > result.best.metrics["latency_s"]


def test_an_operator_with_a_kernel_of_its_own_is_not_decomposed():
    """silu_backward has a composite definition and a kernel of its own: it is one SiLUGrad
    (decomposing it once made it a Sub and three Muls)."""
    def step(x):
        torch.nn.functional.silu(x).sum().backward()

    def setup():
        torch.set_default_dtype(torch.bfloat16)
        return (torch.randn(1024, 1024, requires_grad=True),)

    counts = op_counts(run_torch(step, setup=setup, hardware="ascend910b"))
    assert counts["SiLUGrad"] == 1 and "Sub" not in counts


# -- found by a reviewer ---------------------------------------------------------------------------

def test_foreach_norm_streams_every_element_of_its_tensors():
    """clip_grad_norm_(foreach=True): _foreach_norm reads 8 tensors of 4096 x 4096 and writes
    one number for each; it streams the 8 x 16.8 M elements, costing about what 8 separate
    norms do (it once counted 8 elements of 16 M bytes each: 54 s)."""
    def setup():
        torch.set_default_dtype(torch.bfloat16)
        params = [torch.nn.Parameter(torch.randn(4096, 4096)) for _ in range(8)]
        for p in params:
            p.grad = torch.randn(4096, 4096)
        return (params,)

    def fused(params):
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)

    profile = run_torch(fused, setup=setup, hardware="ascend910b")
    norm = next(op for op in profile.ops if op.op_type == "ForeachNorm")
    assert norm.input_shapes == [[8 * 4096 * 4096]]
    assert norm.duration_s < 0.01  # 8 x 32 MiB read at HBM speed: about 0.2 ms


def test_out_and_resize_take_the_memory_they_write():
    """torch.add(a, b, out=c) with an empty c, and c.resize_(512, 512): c's storage grows to
    1 MiB (fp32) and the card holds it: a, b and c, 3 MiB (+512 B each, the allocator's)."""
    mib = 512 * 512 * 4 + 512

    def with_out(a, b):
        c = torch.empty(0)
        torch.add(a, b, out=c)
        return c

    def with_resize(a, b):
        c = torch.empty(0)
        c.resize_(512, 512)
        torch.add(a, b, out=c)
        return c

    for step in (with_out, with_resize):
        profile = run_torch(step, torch.randn(512, 512), torch.randn(512, 512), memory=True, hardware="ascend910b")
        assert profile.memory_peak.allocated_bytes >= 3 * mib, step.__name__


def test_in_place_views_run_no_kernel():
    def step(x):
        x.unsqueeze_(0)
        x.t_() if x.dim() == 2 else x.squeeze_(0)
        return x * 2

    counts = op_counts(run_torch(step, torch.randn(64, 64), hardware="ascend910b"))
    assert counts == {"Mul": 1}


def test_pow_with_a_tensor_exponent():
    counts = op_counts(run_torch(lambda x, y: (x ** y, 2 ** x), torch.randn(64), torch.randn(64)))
    assert counts == {"Pow": 2}


def test_op_callbacks_see_the_captured_ops():
    from simulator import register_op_callback

    seen = []
    handle = register_op_callback("FlashAttention*", seen.append)
    try:
        run_torch(train_step, setup=setup_block, hardware="ascend910b")
    finally:
        handle.remove()
    assert [op.op_type for op in seen] == ["FlashAttention", "FlashAttentionGrad"]


def test_a_failing_captured_test_is_recorded_and_replays_offline(pytester):
    pytester.makepyfile(test_model=MODEL.format(attention="sdpa"))
    pytester.runpytest_subprocess("--oam-save-baseline").assert_outcomes(passed=1)
    pytester.makepyfile(test_model=MODEL.format(attention="math"))
    failed = pytester.runpytest_subprocess("--oam-baseline")
    failed.assert_outcomes(failed=1)
    records = list((pytester.path / ".oam" / "records").glob("*.oam.json.gz"))
    assert len(records) == 1
    from pytest_oam.cli import main

    assert main(["replay", str(records[0])]) == 1  # the same verdict, offline: regressed
