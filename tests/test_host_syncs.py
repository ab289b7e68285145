"""How often a training step waits on the host: counted with a TorchDispatchMode over 20 steps of the tiny preset
between logging steps (evaluation and logging off). On a GPU each such read stalls the queue of kernels. With
padding removal (CPUs) a micro-batch reads twice (whether it has padding, and where); without it (as on a GPU) a
step reads nothing."""

import json
from collections import Counter

import pytest
from torch.utils._python_dispatch import TorchDispatchMode

from pretraining_runs import FAST

# the ops that read a device value on the host (a Python number, or a size that depends on the data)
HOST_READS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.item.default"}


class HostReads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in HOST_READS:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "accumulation, padding_removal, mixed, schedule",
    [
        (1, True, False, "official"),
        (2, True, False, "official"),
        (2, False, False, "official"),
        (2, False, True, "official"),
        (1, False, False, "wsd"),
    ],
)
@pytest.mark.trains
def test_a_training_step_reads_the_host_only_to_remove_padding(
    tmp_path, accumulation, padding_removal, mixed, schedule, fresh_accelerate_state, monkeypatch, tiny_checkpoint
):
    """Padding removal (CPUs only: RealTokens.pays_on; turned off here as on a GPU) reads whether the batch has
    padding (transformers' create_bidirectional_mask) and where (nonzero): one of each per micro-batch. Without it
    the model builds SDPA's mask itself and reads nothing. A mix of sources (`mixed`) counts each source's tokens
    and pairs on the device: nothing more is read. Nor does the WSD schedule (its decay over steps 13 to 22 among
    the steps counted): its rate is a function of the step count, on the host."""
    from albert_hf.modeling_albert_hf import RealTokens
    from albert_hf.pretraining import job as pretraining
    from albert_hf.pretraining.training import loop

    if not padding_removal:
        monkeypatch.setattr(RealTokens, "pays_on", staticmethod(lambda device: False))
    sources = []
    if mixed:  # the embedded corpus in two halves, two sources
        from data_fixtures import embedded

        halves = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
        for i, half in enumerate(halves):
            half.write_text("".join(json.dumps({"text": text}) + "\n" for text in embedded()["text"][i:3000:2]))
        sources = [
            "--sources",
            f"name=a,weight=0.7,train_files={halves[0]}",
            f"name=b,weight=0.3,train_files={halves[1]}",
            "--tokenizer_name",
            str(tiny_checkpoint),
        ]
    args = pretraining.parse_args(
        [
            "--output_dir",
            str(tmp_path / "run"),
            *FAST,
            "--model_config",
            "tiny",
            "--max_train_steps",
            "22",
            "--logging_steps",
            "1000",
            "--eval_steps",
            "0",
            "--validation_split_percentage",
            "0",
            "--gradient_accumulation_steps",
            str(accumulation),
            "--no_plots",
            "--lr_scheduler_type",
            schedule,
            *(["--decay_steps", "10"] if schedule == "wsd" else []),
            *sources,
        ]
    )
    assert (args.sources is not None) == mixed
    run = pretraining.prepare(args)
    marks, reads = [], HostReads()
    step = loop.training_step

    def marked_step(*args, **kwargs):
        marks.append(len(reads.ops))
        return step(*args, **kwargs)

    monkeypatch.setattr(loop, "training_step", marked_step)  # where optimizer_step looks it up
    with reads:
        pretraining.fit(run)
    # steps 2 to 21: from one step's start to the next (the last step logs)
    per_step = [Counter(reads.ops[a:b]) for a, b in zip(marks[1:-1], marks[2:])]
    assert len(per_step) == 20
    # The loop reads nothing between logging steps, and the model sizes its MLM head from the collator's
    # fixed-size masked positions. (A micro-batch without padding skips padding removal and its nonzero.)
    assert all(set(count) <= {"aten._local_scalar_dense.default", "aten.nonzero.default"} for count in per_step)
    reads_per_micro_batch = 1 if padding_removal else 0
    assert all(
        count["aten._local_scalar_dense.default"] == accumulation * reads_per_micro_batch for count in per_step
    ), per_step
    nonzero = max(count["aten.nonzero.default"] for count in per_step)
    assert nonzero == accumulation * reads_per_micro_batch, per_step


@pytest.mark.parametrize("limit, reads_per_step", [("25", 1), ("0", 0)])
def test_the_skip_check_waits_on_the_step_before_only_when_a_limit_is_set(
    tmp_path, fresh_accelerate_state, monkeypatch, limit, reads_per_step
):
    """--max_consecutive_skips reads the count of skipped steps each step (on a GPU: the previous step's, through
    an event); with 0 (no limit) nothing is read and no event is waited on."""
    from albert_hf.pretraining import job as pretraining
    from albert_hf.pretraining.training.state import LaggedRead

    args = pretraining.parse_args(
        [
            "--output_dir",
            str(tmp_path / "run"),
            *FAST,
            "--model_config",
            "tiny",
            "--max_train_steps",
            "6",
            "--logging_steps",
            "1000",
            "--eval_steps",
            "0",
            "--validation_split_percentage",
            "0",
            "--no_plots",
            "--max_consecutive_skips",
            limit,
        ]
    )
    run = pretraining.prepare(args)
    read, steps = LaggedRead.read, []
    monkeypatch.setattr(LaggedRead, "read", lambda self, step: steps.append(step) or read(self, step))
    pretraining.fit(run)
    assert steps == [step for step in range(1, 7) for _ in range(reads_per_step)]
