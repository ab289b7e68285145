"""The paper's switches crossed with every process setup: one process, DDP over 2, FSDP2 over 2 with
reshard_after_forward true and false; --sharing all / attention / ffn / none (Table 4); --task sop / nsp / none
(Table 5); accumulation 1 and 2. Every combination trains two steps; none ends in a traceback. One launch per
setup: its combinations run in turn inside it (tests/launched_runs.py)."""

import itertools
import math

import pytest
import torch
from safetensors.torch import load_file

from test_distributed import DDP, FSDP
from test_pretraining import metrics, pretrain_runs

pytestmark = [pytest.mark.trains, pytest.mark.launched]  # one module fixture launches every setup

SWITCHES = list(itertools.product(["all", "attention", "ffn", "none"], ["sop", "nsp", "none"], [1, 2]))
SETUPS = {"one process": (None, [None]), "DDP": (DDP, [None]), "FSDP2": (FSDP, ["true", "false"])}
FROZEN = "--task none: the pooler and the sentence-order head are frozen (no loss trains them)"
STEPS = ["--max_train_steps", "2", "--eval_steps", "0", "--validation_split_percentage", "0", "--no_plots"]
BORROWING = ["attention", "ffn"]  # also trained 4 steps to the end under DDP and FSDP2, whose weights must agree


@pytest.fixture(scope="module")
def setups(tmp_path_factory):
    """Per setup: its cases (sharing, task, accumulation, reshard), their output folders, results, the launch.
    The tiny preset with 2 layers: block 1 borrows from block 0, and each run costs less."""
    from albert_hf import AlbertHFConfig

    model = tmp_path_factory.mktemp("config")
    AlbertHFConfig.from_preset("tiny", num_hidden_layers=2).save_pretrained(model)
    found = {}
    for setup, (launcher, reshards) in SETUPS.items():
        root = tmp_path_factory.mktemp(setup.replace(" ", "_"))
        runs, cases = [], []
        for reshard, (sharing, task, accumulation) in itertools.product(reshards, SWITCHES):
            env = {"FSDP_RESHARD_AFTER_FORWARD": reshard} if reshard else {}
            runs.append((root / f"{sharing}-{task}-{accumulation}-{reshard}",
                         ["--config_name", str(model), "--sharing", sharing, "--task", task,
                          "--gradient_accumulation_steps", str(accumulation), *STEPS], env))
            cases.append((sharing, task, accumulation, reshard))
        if launcher is not None:
            for sharing in BORROWING:
                full = ["--config_name", str(model), "--sharing", sharing, *STEPS, "--max_train_steps", "4",
                        "--per_device_train_batch_size", "4"]
                runs.append((root / f"full-{sharing}", full,
                             {"FSDP_RESHARD_AFTER_FORWARD": "true"} if reshards[0] else {}, False))
        results, done = pretrain_runs(runs, launcher=launcher, steps_only=True)
        found[setup] = cases, [run[0] for run in runs], results, done
    return found


@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_every_combination_of_the_papers_switches_trains_two_steps(setups, setup):
    cases, outs, results, done = setups[setup]
    failed = [(case, result["line"]) for case, result in zip(cases, results) if result["status"] != 0]
    assert not failed and len(results) == len(outs), (failed, done.stderr[-3000:])
    assert "Traceback" not in done.stderr
    for out, (sharing, task, accumulation, reshard) in zip(outs, cases):
        [row] = metrics(out)  # logged every 2 steps: one row, at the second step
        assert row["step"] == 2 and math.isfinite(row["train_mlm_loss"]), (sharing, task, accumulation, reshard)
        assert ("train_nsp_loss" in row, "train_sop_loss" in row) == (task == "nsp", task == "sop"), row
    reshards = SETUPS[setup][1]
    assert done.stderr.count(FROZEN) == len(reshards) * 8  # named in the start line of each --task none run
    if setup == "FSDP2":
        for reshard in reshards:
            expected = len(SWITCHES) + len(BORROWING) * (reshard == "true")
            assert done.stderr.count(f"of the parameters (reshard_after_forward {reshard})") == expected


@pytest.mark.parametrize("sharing", BORROWING)
@pytest.mark.rounding
def test_borrowed_modules_under_fsdp2_resharded_after_forward_end_with_the_ddp_weights(setups, sharing):
    """Every block gathers the attention or FFN it borrows from block 0, and its gradient gathers every use."""
    ddp, fsdp = (load_file(setups[setup][1][-len(BORROWING) + BORROWING.index(sharing)] / "model.safetensors")
                 for setup in ("DDP", "FSDP2"))
    assert ddp.keys() == fsdp.keys()
    for name in ddp:
        torch.testing.assert_close(fsdp[name], ddp[name], rtol=0, atol=1e-5, msg=name)
