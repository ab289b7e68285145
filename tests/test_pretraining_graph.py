"""--torch_compile_mode whole-step-graph: what a CPU can check of it. The capture itself needs CUDA (checked on a GPU
by benchmarks/gpu_session.sh); here a stand-in that runs what it captures replaces the CUDA graph, so the static
buffers, the device learning rate, the undone warm-up and the eager steps of other shapes are checked against the
eager loop; and every refusal is one line."""

import json
import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from albert_hf import AlbertHFForPreTraining
from albert_hf.optimization import Lamb, get_official_schedule, parameter_groups
from albert_hf.pretraining.data.collator import fixed_size_positions
from albert_hf.pretraining.training.step import training_step
from albert_hf.pretraining.training.step_graph import MODE, RunsEagerly, StepGraph, refusal
from helpers import DDP, run_bounded, subprocess_env, tiny_config
from pretraining_runs import pretrain


class RunsAtCapture(RunsEagerly):
    """RunsEagerly (capture runs the body, which StepGraph undoes, as a real capture runs nothing; a replay runs it
    again into the captured output) keeping the weights it found at capture: a real capture records the step from
    there."""

    def __init__(self, model):
        self.model = model

    def capture(self, body):
        self.weights_at_capture = [p.detach().clone() for p in self.model.parameters()]
        return super().capture(body)


def batch(rows: int, seq: int = 16, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, 1000, (rows, seq), generator=generator)
    labels = torch.full_like(input_ids, -100)
    labels[:, 1:4] = input_ids[:, 1:4]
    positions, weights = fixed_size_positions(labels.numpy(), 4)
    return dict(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        token_type_ids=torch.zeros_like(input_ids),
        labels=labels,
        sentence_order_label=torch.randint(0, 2, (rows,), generator=generator),
        masked_lm_positions=torch.from_numpy(positions),
        masked_lm_weights=torch.from_numpy(weights),
    )


def training_run(accelerator):
    torch.manual_seed(0)
    model = AlbertHFForPreTraining(tiny_config()).train()
    optimizer = Lamb(parameter_groups(model), lr=1e-2)
    return model, optimizer, get_official_schedule(optimizer, num_warmup_steps=2, num_training_steps=10)


def test_a_replayed_step_trains_as_the_eager_loop_also_after_eager_steps_and_across_shapes(
    fresh_accelerate_state, caplog
):
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    # two steps of two micro-batches of 4 rows, then one of 3 rows (an epoch's last), then 4 rows again
    steps = [
        [batch(4, seed=1), batch(4, seed=2)],
        [batch(4, seed=3), batch(4, seed=4)],
        [batch(3, seed=5)],
        [batch(4, seed=6), batch(4, seed=7)],
    ]
    eager_model, eager_optimizer, eager_schedule = training_run(accelerator)
    graph_model, graph_optimizer, graph_schedule = training_run(accelerator)
    expected, got = [], []
    for micro_batches in [[batch(4, seed=9), batch(4, seed=8)], *steps]:
        expected.append(training_step(eager_model, micro_batches, eager_optimizer, eager_schedule, accelerator, 1.0))
    # the first step eager, so that the optimizer has state when the graph is captured (a resumed run has too)
    got.append(
        training_step(
            graph_model, [batch(4, seed=9), batch(4, seed=8)], graph_optimizer, graph_schedule, accelerator, 1.0
        )
    )
    before = [p.detach().clone() for p in graph_model.parameters()]
    graph = StepGraph(
        graph_model, graph_optimizer, accelerator, 1.0, "global", graph_factory=lambda: RunsAtCapture(graph_model)
    )
    with caplog.at_level(logging.INFO, logger="albert_hf"):
        for micro_batches in steps:
            got.append(graph(micro_batches))
            graph_schedule.step()
    assert graph.eager_steps == 1 and caplog.text.count("runs eagerly") == 1
    for want, have in zip(before, graph.graph.weights_at_capture):  # the warm-up steps were undone before capture
        assert torch.equal(have, want)
    assert isinstance(graph_optimizer.param_groups[0]["lr"], torch.Tensor)  # filled in place by the schedule
    assert float(graph_optimizer.param_groups[0]["lr"]) == pytest.approx(eager_schedule.get_last_lr()[0])
    for want, have in zip(expected, got):
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-6)
    # had the warm-up steps stayed, the weights would be 3 updates of lr 1e-2 away
    for (name, want), have in zip(eager_model.named_parameters(), graph_model.parameters()):
        torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-6, msg=name)


def ddp_steps(report: str):
    """In each of 2 processes (DDP over gloo, run by the test below): the eager loop's steps with DDP's reducer, and
    the same steps captured (the stand-in), where the step averages the gradients itself. Asserts in each process;
    the first writes `report`."""
    from accelerate import Accelerator

    from albert_hf.pretraining.training import step as pretraining_step
    from albert_hf.pretraining.training.step_graph import WARMUP_STEPS

    reductions = []
    own = pretraining_step.average_gradients
    pretraining_step.average_gradients = lambda *args: reductions.append(1) or own(*args)
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    # each process its own batches; an epoch's shorter last step runs eagerly, through DDP's reducer
    steps = [[batch(4, seed=10 * rank + k), batch(4, seed=10 * rank + k + 1)] for k in (1, 3)] + [
        [batch(3, seed=10 * rank + 5)],
        [batch(4, seed=10 * rank + 6), batch(4, seed=10 * rank + 7)],
    ]
    first = [batch(4, seed=10 * rank + 8), batch(4, seed=10 * rank + 9)]
    eager_model, eager_optimizer, eager_schedule = training_run(accelerator)
    graph_model, graph_optimizer, graph_schedule = training_run(accelerator)
    eager_model, eager_optimizer = accelerator.prepare(eager_model, eager_optimizer)
    graph_model, graph_optimizer = accelerator.prepare(graph_model, graph_optimizer)
    expected = [
        training_step(eager_model, micro_batches, eager_optimizer, eager_schedule, accelerator, 1.0)
        for micro_batches in [first, *steps]
    ]
    got = [training_step(graph_model, first, graph_optimizer, graph_schedule, accelerator, 1.0)]
    graph = StepGraph(
        graph_model, graph_optimizer, accelerator, 1.0, "global", graph_factory=lambda: RunsAtCapture(graph_model)
    )
    for micro_batches in steps:
        got.append(graph(micro_batches))
        graph_schedule.step()
    # the warm-up steps, the capture and 3 replays averaged their own gradients; the eager steps did not
    assert len(reductions) == WARMUP_STEPS + 1 + 3 and graph.eager_steps == 1, (len(reductions), graph.eager_steps)
    for want, have in zip(expected, got):
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-6)
    worst = 0.0
    for (name, want), have in zip(eager_model.named_parameters(), graph_model.parameters()):
        torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-6, msg=name)
        gathered = accelerator.gather(have.detach()[None])  # both processes hold the same weights
        assert torch.equal(gathered[0], gathered[1]), name
        worst = max(worst, float((have - want).abs().max()))
    if rank == 0:
        moved = max(
            float((p - q).abs().max())
            for p, q in zip(graph_model.parameters(), training_run(accelerator)[0].parameters())
        )
        Path(report).write_text(json.dumps({"worst": worst, "moved": moved, "reductions": len(reductions)}))


@pytest.mark.launched
def test_a_ddp_step_captured_averages_its_own_gradients_and_trains_as_ddp(tmp_path):
    # the code path and the losses of the captured DDP step; the capture of the all-reduce itself needs NCCL on GPUs
    report = tmp_path / "report.json"
    done = run_bounded([*DDP, __file__, str(report)], 240, env=subprocess_env(), cwd=tmp_path)
    assert done.returncode == 0 and report.is_file(), done.stderr[-4000:]
    found = json.loads(report.read_text())
    assert found["moved"] > 1e-3 and found["worst"] < 1e-4  # they trained, alike


@pytest.mark.parametrize("foreach", [True, False])
def test_lamb_takes_a_device_learning_rate_that_the_schedule_fills(foreach):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5, 3, dtype=torch.float64)) for _ in range(2)]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    start = [p.detach().clone() for p in params]
    optimizer, twin_optimizer = Lamb(params, lr=0.1, foreach=foreach), Lamb(twins, lr=0.1, foreach=foreach)
    rate = torch.tensor(0.1, dtype=torch.float64)
    twin_optimizer.param_groups[0]["lr"] = rate
    schedule = get_official_schedule(optimizer, num_warmup_steps=2, num_training_steps=6)
    twin_schedule = get_official_schedule(twin_optimizer, num_warmup_steps=2, num_training_steps=6)
    for _ in range(4):
        for p, t in zip(params, twins):
            p.grad = torch.sin(p.detach() * 3)
            t.grad = p.grad.clone()
        optimizer.step(), twin_optimizer.step(), schedule.step(), twin_schedule.step()
    assert twin_optimizer.param_groups[0]["lr"] is rate and float(rate) == pytest.approx(schedule.get_last_lr()[0])
    for p, t, s in zip(params, twins, start):
        torch.testing.assert_close(t, p, rtol=1e-12, atol=1e-14)
        assert (p - s).abs().max() > 1e-3  # they moved


def accelerator_like(distributed="NO", device="cuda", precision="bf16"):
    from accelerate.utils import DistributedType

    return SimpleNamespace(
        distributed_type=DistributedType[distributed], device=torch.device(device), mixed_precision=precision
    )


@pytest.mark.parametrize(
    "accelerator, checkpointing, says",
    [
        (
            accelerator_like("FSDP"),
            False,
            "this run shards the model with FSDP, whose collectives the graph does not hold",
        ),
        (accelerator_like("DEEPSPEED"), False, "shards the model with DeepSpeed"),
        (accelerator_like(device="cpu"), False, "this run is on cpu, not a CUDA device"),
        (accelerator_like(precision="fp16"), False, "fp16's loss scaler reads the device every step"),
        (accelerator_like(), True, "activation checkpointing (--gradient_checkpointing or the FSDP config's)"),
    ],
)
def test_what_cannot_be_captured_is_refused_in_one_line(accelerator, checkpointing, says):
    reason = refusal(accelerator, checkpointing)
    assert reason.startswith(f"--torch_compile_mode {MODE} captures the training step as a CUDA graph: ")
    assert says in reason and "\n" not in reason


@pytest.mark.parametrize("precision", ["bf16", "no"])
@pytest.mark.parametrize("distributed", ["NO", "MULTI_GPU"])
def test_one_process_or_ddp_on_a_cuda_device_in_bf16_or_fp32_is_captured(precision, distributed):
    assert refusal(accelerator_like(distributed, precision=precision), False) is None


def test_the_script_on_a_cpu_stops_with_the_reason_and_writes_nothing(tmp_path):
    done = pretrain(tmp_path / "run", "--torch_compile_mode", MODE, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: --torch_compile_mode {MODE} captures the training step as a CUDA graph: this run is on "
        "cpu, not a CUDA device; drop it or use another mode"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "device, processes, sharding, precision, checkpointing, rollback, mode, says",
    [
        ("cpu", 1, None, "bf16", False, False, None, None),  # CPUs keep the eager step, and nothing is said of it
        ("cpu", 2, "FSDP", "no", False, False, None, None),
        ("cuda", 1, None, "bf16", False, False, MODE, None),  # the fastest measured step
        ("cuda", 1, None, "no", False, False, MODE, None),
        (
            "cuda",
            8,
            None,
            "bf16",
            False,
            False,
            None,
            f"under DDP (8 processes) the graph is not yet the default, not "
            f"having run on GPUs: --torch_compile_mode {MODE} asks for it",
        ),
        (
            "cuda",
            2,
            "FSDP",
            "bf16",
            False,
            False,
            None,
            "this run shards the model with FSDP, whose collectives the graph does not hold",
        ),
        ("cuda", 2, "DeepSpeed", "bf16", False, False, None, "this run shards the model with DeepSpeed"),
        ("cuda", 1, None, "fp16", False, False, None, "fp16's loss scaler reads the device every step"),
        ("cuda", 1, None, "bf16", True, False, None, "activation checkpointing"),
        ("cuda", 1, None, "bf16", False, True, None, "--on_divergence rollback loads checkpoints"),
    ],
)
def test_the_default_step_is_the_whole_step_graph_where_it_can_run_on_a_cuda_device(
    device, processes, sharding, precision, checkpointing, rollback, mode, says
):
    from albert_hf.pretraining.training.step_graph import default_mode

    chosen, note = default_mode(device, processes, sharding, precision, checkpointing, rollback)
    assert chosen == mode
    if says is None:
        assert note is None
    else:
        assert note.startswith("eager step, not the whole-step graph a CUDA device gets by default: ") and says in note
        assert note.endswith("(--torch_compile_mode none asks for eager and silences this)") and "\n" not in note


@pytest.mark.parametrize(
    "flags, device, compiled, mode",
    [
        ([], "cuda", True, MODE),  # nothing asked: the default on a CUDA device
        ([], "cpu", False, None),  # ... and on a CPU
        (["--torch_compile_mode", "none"], "cuda", False, None),  # eager asked for
        (["--torch_compile"], "cuda", True, None),  # --torch_compile alone: the blocks compiled, as before
        (["--torch_compile", "false"], "cuda", False, None),  # an explicit no to compiling is eager
        (["--torch_compile_mode", "default"], "cuda", True, "default"),
        (["--gradient_checkpointing"], "cuda", False, None),
    ],
)
def test_an_explicit_choice_of_step_wins_over_the_default(tmp_path, flags, device, compiled, mode):
    from albert_hf.pretraining.resolution import choose_step, parse_args
    from albert_hf.runtime.hardware import Precision

    args = parse_args(["--output_dir", str(tmp_path / "run"), *flags])
    hardware = SimpleNamespace(device=device)
    chosen = choose_step(args, hardware, Precision("bf16", "test"))  # (compiled, mode, notes): the machine's plan
    notes = chosen[2]
    assert chosen[:2] == (compiled, mode)
    assert len(notes) == (1 if "--gradient_checkpointing" in flags else 0)


@pytest.mark.parametrize(
    "env, flags, mode, says",
    [
        ({"WORLD_SIZE": "2"}, [], None, "under DDP (2 processes) the graph is not yet the default"),
        ({"WORLD_SIZE": "2"}, ["--torch_compile_mode", MODE], MODE, None),  # asked for: DDP's graph
        ({"WORLD_SIZE": "2", "ACCELERATE_USE_FSDP": "true"}, [], None, "this run shards the model with FSDP"),
        ({"WORLD_SIZE": "2", "ACCELERATE_USE_DEEPSPEED": "true"}, [], None, "this run shards the model with DeepSpeed"),
    ],
)
def test_a_launch_of_several_processes_on_cuda_devices_gets_the_eager_step_by_default_and_says_why(
    tmp_path, monkeypatch, env, flags, mode, says
):
    from albert_hf.pretraining.resolution import choose_step, parse_args
    from albert_hf.runtime.hardware import Precision

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = parse_args(["--output_dir", str(tmp_path / "run"), *flags])
    assert args.processes == 2
    _, chosen_mode, notes = choose_step(args, SimpleNamespace(device="cuda"), Precision("bf16", "test"))
    assert chosen_mode == mode
    assert (notes == []) if says is None else (len(notes) == 1 and says in notes[0])


if __name__ == "__main__":  # launched by test_a_ddp_step_captured_averages_its_own_gradients_and_trains_as_ddp
    ddp_steps(sys.argv[1])
