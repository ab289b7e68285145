"""How often a training step waits on the host: counted with a TorchDispatchMode over 20 steps of the tiny preset
between logging steps (evaluation and logging off). On a GPU each such read stalls the queue of kernels."""

from collections import Counter

import pytest
from test_pretraining import FAST
from torch.utils._python_dispatch import TorchDispatchMode

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


@pytest.mark.parametrize("accumulation", [1, 2])
def test_a_training_step_reads_the_host_a_pinned_number_of_times_per_micro_batch(tmp_path, accumulation,
                                                                                 fresh_accelerate_state):
    from albert_hf import pretraining

    args = pretraining.parse_args(["--output_dir", str(tmp_path / "run"), *FAST, "--model_config", "tiny",
                                   "--max_train_steps", "22", "--logging_steps", "1000", "--eval_steps", "0",
                                   "--validation_split_percentage", "0", "--gradient_accumulation_steps",
                                   str(accumulation), "--no_plots"])
    run = pretraining.prepare(args)
    marks, reads = [], HostReads()
    step = pretraining.training_step

    def marked_step(*args, **kwargs):
        marks.append(len(reads.ops))
        return step(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pretraining, "training_step", marked_step)
        with reads:
            pretraining.fit(run)
    # steps 2 to 21: from one step's start to the next (the last step logs)
    per_step = [Counter(reads.ops[a:b]) for a, b in zip(marks[1:-1], marks[2:])]
    assert len(per_step) == 20
    # What remains, per micro-batch, all in the model: the widest row of masked positions (masked_positions),
    # transformers' check for a mask without padding (create_bidirectional_mask), and padding removal's nonzero
    # (CPUs only). The loop itself reads nothing between logging steps: it read the real-token count of every
    # micro-batch and, with several processes, the stop signal's all-reduce at every step.
    # (a micro-batch without padding skips padding removal, and its nonzero with it)
    assert all(set(count) <= {"aten._local_scalar_dense.default", "aten.nonzero.default"} for count in per_step)
    assert all(count["aten._local_scalar_dense.default"] == 2 * accumulation for count in per_step), per_step
    assert max(count["aten.nonzero.default"] for count in per_step) == accumulation, per_step
